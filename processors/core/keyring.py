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

Pure: no I/O beyond the operating system's random numbers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentlog.core.sealing import DataKey
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


class LocalKek:
    """A 256-bit AES-GCM key-encryption key held by the worker (a file or an environment variable)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise KeyringError("a key-encryption key is 32 bytes (base64 of 32 random bytes)")
        self._aead = AESGCM(secret)
        self._id = "local-" + hashlib.sha256(b"agentlog kek id\0" + secret).hexdigest()[:16]

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

    def __repr__(self) -> str:
        return f"LocalKek({self._id!r})"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One run's entry in the keyring (the value of its record; the record's key is the run id)."""

    run_id: str
    key_id: str
    subject: str
    parent_run_id: str | None
    kek_id: str
    wrapped: bytes

    def to_value(self) -> bytes:
        doc: dict[str, Any] = {"runId": self.run_id, "keyId": self.key_id, "subject": self.subject,
                               "kekId": self.kek_id, "wrapped": base64.b64encode(self.wrapped).decode()}
        if self.parent_run_id is not None:
            doc["parentRunId"] = self.parent_run_id
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_value(cls, value: bytes) -> KeyRecord:
        try:
            doc = json.loads(value)
            return cls(run_id=doc["runId"], key_id=doc["keyId"], subject=doc["subject"],
                       parent_run_id=doc.get("parentRunId"), kek_id=doc["kekId"],
                       wrapped=base64.b64decode(doc["wrapped"], validate=True))
        except (ValueError, KeyError, TypeError) as e:
            raise KeyringError(f"a keyring record does not parse: {e}") from e


def _context(run_id: str, key_id: str) -> bytes:
    return json.dumps([run_id, key_id]).encode()


def mint(run_id: str, subject: str | None, parent_run_id: str | None, wrapper: KeyWrapper) -> tuple[DataKey, KeyRecord]:
    """A new data key for ``run_id`` and its keyring record. Without a subject, the run is its own subject."""
    secret = os.urandom(32)
    key_id = os.urandom(8).hex()
    record = KeyRecord(run_id=run_id, key_id=key_id, subject=subject if subject else run_id,
                       parent_run_id=parent_run_id, kek_id=wrapper.kek_id,
                       wrapped=wrapper.wrap(secret, _context(run_id, key_id)))
    return DataKey(key_id, secret), record


def unwrap(record: KeyRecord, wrappers: Mapping[str, KeyWrapper]) -> DataKey:
    """The data key of ``record``, unwrapped by the KEK it names."""
    wrapper = wrappers.get(record.kek_id)
    if wrapper is None:
        raise KeyringError(f"run {record.run_id}'s data key is wrapped by {record.kek_id}, which is not configured; "
                           f"configured: {sorted(wrappers) or 'none'}")
    return DataKey(record.key_id, wrapper.unwrap(record.wrapped, _context(record.run_id, record.key_id)))


def runs_to_erase(records: Iterable[KeyRecord], *, subject: str | None = None, run: str | None = None) -> list[str]:
    """The runs an erasure of ``subject`` (its runs) or of ``run`` reaches, with every descendant, sorted."""
    if (subject is None) == (run is None):
        raise ValueError("name a subject or a run")
    children: dict[str, list[str]] = {}
    roots: list[str] = []
    for r in records:
        if r.parent_run_id is not None:
            children.setdefault(r.parent_run_id, []).append(r.run_id)
        if (subject is not None and r.subject == subject) or r.run_id == run:
            roots.append(r.run_id)
    seen: set[str] = set()
    todo = roots
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(children.get(current, ()))
    return sorted(seen)
