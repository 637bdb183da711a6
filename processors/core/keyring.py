"""Data keys, how they are wrapped, and which runs an erasure reaches.

Every run has a data key of its own (:class:`~agentlog.core.sealing.DataKey`), minted by the run's one writer,
so two workers never race to create a key. The keyring holds one :class:`KeyRecord` per run: the data key
wrapped by a key-encryption key (KEK), the run's data subject and its parent run. Erasing a subject deletes the
keys of its runs and of their descendants (:func:`runs_to_erase`); erasing a run deletes its key and its
descendants'. A child run inherits its parent's subject through the parent link, whatever order the records
arrive in.

Wrapping is behind :class:`KeyWrapper`, so a cloud KMS plugs in where :class:`LocalKek` (a 256-bit key read from a
file or the environment) is used. Records name the KEK that wrapped them: during a rotation, records under the old
and the new KEK are both readable while the old one is kept.

A subject id is personal data too, so a record holds its *tag*, an HMAC of the id under a secret derived from the
KEK (:meth:`KeyWrapper.tag`): the keyring can be searched for a subject by whoever holds the KEK, and reveals no id
to whoever does not. An erased run's record keeps its run, key id, tag and parent with ``erasedAtMs`` and no key:
compaction then drops the record that held the key, and the marker keeps saying that the key existed and is gone.

Pure: no I/O beyond the operating system's random numbers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from orjson import loads

from agentlog.core.sealing import DataKey
from agentlog.schemas.canonical import jcs
from agentlog.schemas.errors import AgentlogError

__all__ = ["KeyRecord", "KeyWrapper", "KeyringError", "LocalKek", "mint", "runs_to_erase", "unwrap"]


class KeyringError(AgentlogError):
    """A data key cannot be unwrapped: its KEK is not configured, or the record was altered.

    Configure every KEK the keyring's records name (``kekId``); a lost KEK makes its runs' content unreadable,
    exactly as an erasure would.
    """

    code = "keyring_error"


class KeyWrapper(Protocol):
    """A key-encryption key: wraps data keys for storage, bound to a context (the run id)."""

    @property
    def kek_id(self) -> str: ...

    def wrap(self, secret: bytes, context: bytes) -> bytes: ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes: ...

    def tag(self, subject: str) -> str:
        """A keyed digest of a subject id: equal ids give equal tags, and the tag does not give the id back."""
        ...


class LocalKek:
    """A 256-bit AES-GCM key-encryption key held by the worker (a file or an environment variable)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise KeyringError("a key-encryption key is 32 bytes (base64 of 32 random bytes)")
        self._aead = AESGCM(secret)
        self._id = "local-" + hashlib.sha256(b"agentlog kek id\0" + secret).hexdigest()[:16]
        self._tag_key = hashlib.sha256(b"agentlog subject tag\0" + secret).digest()

    @property
    def kek_id(self) -> str:
        return self._id

    def wrap(self, secret: bytes, context: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, secret, context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        try:
            return self._aead.decrypt(wrapped[:12], wrapped[12:], context)
        except InvalidTag as e:
            raise KeyringError(f"a data key wrapped by {self._id} does not unwrap: the record was altered") from e

    def tag(self, subject: str) -> str:
        return hmac.new(self._tag_key, subject.encode("utf-8"), hashlib.sha256).hexdigest()[:32]

    def __repr__(self) -> str:
        return f"LocalKek({self._id!r})"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One run's entry in the keyring (the value of its record; the record's key is the run id).

    ``subject`` is the subject's tag (:meth:`KeyWrapper.tag`), never the id. An erased run's entry has
    ``erased_at_ms`` and no ``wrapped`` key.
    """

    run_id: str
    key_id: str
    subject: str
    parent_run_id: str | None
    kek_id: str
    wrapped: bytes
    erased_at_ms: int | None = None
    #: The run's class (``run.started`` ``runClass``, else its parent's): what the sequencer redacts by.
    run_class: str | None = None

    @property
    def erased(self) -> bool:
        return self.erased_at_ms is not None

    def erase(self, at_ms: int) -> KeyRecord:
        """This run's erased marker: everything but the key."""
        return KeyRecord(run_id=self.run_id, key_id=self.key_id, subject=self.subject,
                         parent_run_id=self.parent_run_id, kek_id=self.kek_id, wrapped=b"", erased_at_ms=at_ms,
                         run_class=self.run_class)

    def to_value(self) -> bytes:
        doc: dict[str, Any] = {"runId": self.run_id, "keyId": self.key_id, "subject": self.subject,
                               "kekId": self.kek_id}
        if self.erased_at_ms is None:
            doc["wrapped"] = base64.b64encode(self.wrapped).decode()
        else:
            doc["erasedAtMs"] = self.erased_at_ms
        if self.parent_run_id is not None:
            doc["parentRunId"] = self.parent_run_id
        if self.run_class is not None:
            doc["runClass"] = self.run_class
        return jcs(doc)

    @classmethod
    def from_value(cls, value: bytes) -> KeyRecord:
        try:
            doc = loads(value)
            erased = doc.get("erasedAtMs")
            if erased is not None and type(erased) is not int:
                raise TypeError("erasedAtMs is not an integer")
            run_class = doc.get("runClass")
            if run_class is not None and not isinstance(run_class, str):
                raise TypeError("runClass is not a string")
            return cls(run_id=doc["runId"], key_id=doc["keyId"], subject=doc["subject"],
                       parent_run_id=doc.get("parentRunId"), kek_id=doc["kekId"],
                       wrapped=b"" if erased is not None else base64.b64decode(doc["wrapped"], validate=True),
                       erased_at_ms=erased, run_class=run_class)
        except (ValueError, KeyError, TypeError) as e:
            raise KeyringError(f"a keyring record does not parse: {e}") from e


def _context(run_id: str, key_id: str) -> bytes:
    return run_id.encode("utf-8") + b"\0" + key_id.encode("ascii")


def mint(run_id: str, subject: str | None, parent_run_id: str | None, wrapper: KeyWrapper, *,
         run_class: str | None = None) -> tuple[DataKey, KeyRecord]:
    """A new data key for ``run_id`` and its keyring record. Without a subject, the run is its own subject."""
    secret = os.urandom(32)
    key_id = os.urandom(8).hex()
    record = KeyRecord(run_id=run_id, key_id=key_id, subject=wrapper.tag(subject if subject else run_id),
                       parent_run_id=parent_run_id, kek_id=wrapper.kek_id,
                       wrapped=wrapper.wrap(secret, _context(run_id, key_id)), run_class=run_class)
    return DataKey(key_id, secret), record


def unwrap(record: KeyRecord, wrappers: Mapping[str, KeyWrapper]) -> DataKey:
    """The data key of ``record``, unwrapped by the KEK it names."""
    if record.erased:
        raise KeyringError(f"run {record.run_id}'s data key was erased")
    wrapper = wrappers.get(record.kek_id)
    if wrapper is None:
        raise KeyringError(f"run {record.run_id}'s data key is wrapped by {record.kek_id}, which is not configured; "
                           f"configured: {sorted(wrappers) or 'none'}")
    return DataKey(record.key_id, wrapper.unwrap(record.wrapped, _context(record.run_id, record.key_id)))


def runs_to_erase(records: Iterable[KeyRecord], *, subject: Collection[str] | None = None,
                  run: str | Collection[str] | None = None) -> list[str]:
    """The runs an erasure reaches, with every descendant, sorted: those tagged with one of ``subject`` (the subject's
    tags, one per configured KEK), or ``run`` (one run or several)."""
    if (subject is None) == (run is None):
        raise ValueError("name a subject or a run")
    named = {run} if isinstance(run, str) else set(run or ())
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for r in records:
        if r.parent_run_id is not None:
            children.setdefault(r.parent_run_id, []).append(r.run_id)
        if (subject is not None and r.subject in subject) or r.run_id in named:
            roots.append(r.run_id)
    seen: set[str] = set()
    todo = roots
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(children.get(current, ()))
    return sorted(seen)
