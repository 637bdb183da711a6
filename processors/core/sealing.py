"""Content sealed under a data key: the stored form of a RunEventDoc, and reading it back.

Past the sequencer a record's content members (``agentlog.schemas.content``) exist only as sealed tokens::

    {"$sealed": "<keyId>.<base64url(AES-GCM-SIV ciphertext of the value's sorted-key JSON)>"}

* **Deterministic.** The nonce is derived from the associated data (run, event, member path), and AES-GCM-SIV is
  misuse-resistant: the same value sealed twice at the same place gives the same bytes, so a redelivered record
  is byte-identical to the first copy (the worker's crash guarantees rest on that), while equal values at two
  places give unrelated tokens.
* **Bound to its place.** The associated data names run, event and path, so a token copied to another event or
  member does not open.
* **Erasable.** Without the data key a token is noise: reading it gives :data:`ERASED`. The hash chain, the state
  hash and checkpoint signatures cover the tokens, so verification needs no key and survives erasure.

Pure: no I/O. Where keys come from is the keyring's business; here a key is bytes and an id.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from agentlog.schemas.canonical import jcs, loads_strict
from agentlog.schemas.content import SEALED, Tree, clear_tree, content_members, is_sealed
from agentlog.schemas.errors import ContractError

__all__ = ["ERASED", "SEALED", "DataKey", "Place", "SealError", "is_sealed", "open_event", "open_record", "open_value",
           "seal_event", "seal_record", "seal_value", "sealed_members", "sealed_paths"]

#: What a member reads as once its key is gone.
ERASED = "[erased]"


class SealError(ContractError):
    """A sealed token that does not open under its key: the record was altered, or the key is not the one used."""

    code = "sealed_token_invalid"


@dataclass(frozen=True, slots=True)
class DataKey:
    """A 256-bit data key and the id the tokens name it by."""

    key_id: str
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != 32:
            raise ValueError("a data key is 32 bytes")
        if "." in self.key_id or not self.key_id:
            raise ValueError("a data key id is non-empty and has no '.'")

    def __repr__(self) -> str:  # the secret never reaches a log
        return f"DataKey({self.key_id!r})"


@lru_cache(maxsize=4096)
def _aead(secret: bytes) -> AESGCMSIV:
    """The cipher of a data key, made once per key (its key schedule costs about as much as sealing a value)."""
    return AESGCMSIV(secret)


def _json(value: Any) -> bytes:
    """``value``'s JSON with sorted keys: the same bytes for equal values, read back by ``loads_strict``.

    A token's plaintext and associated data need to be deterministic, not canonical: no hash covers them (the chain
    covers the token). orjson writes them in C; a value it refuses (an integer past 64 bits, a lone surrogate) takes
    JCS, which refuses what JSON cannot hold.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return jcs(value)


def _aad(run_id: str, event_id: str, path: Place) -> bytes:
    return _json([run_id, event_id, list(path)])


def _nonce(aad: bytes) -> bytes:
    return hashlib.sha256(aad).digest()[:12]


def _walk(doc: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    payload = doc.get("payload")
    if payload is None:
        return
    yield from content_members(payload, clear_tree(doc["type"]))


#: A member's place in a payload or a record: object member names and list indexes.
Place = tuple[str | int, ...]


def _get(record: Any, path: Place) -> Any:
    for step in path:
        if isinstance(step, int):
            if not isinstance(record, list) or not -len(record) <= step < len(record):
                return None
        elif not isinstance(record, dict):
            return None
        record = record[step] if isinstance(step, int) else record.get(step)
    return record


def _set(record: Any, path: Place, value: Any) -> Any:
    """``record`` with the member at ``path`` replaced, copying only the containers on the way."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    out: Any = list(record) if isinstance(record, list) else dict(record)
    out[head] = _set(record[head], rest, value)
    return out


def seal_value(value: Any, key: DataKey, run_id: str, place: str, path: Place = ()) -> dict[str, str]:
    """``value`` as a sealed token bound to (``run_id``, ``place``, ``path``): an event id, or another record's."""
    aad = _aad(run_id, place, path)
    token = _aead(key.secret).encrypt(_nonce(aad), _json(value), aad)
    return {SEALED: f"{key.key_id}.{base64.urlsafe_b64encode(token).decode()}"}


def open_value(token: dict[str, str], key_for: Callable[[str], DataKey | None], run_id: str, place: str,
               path: Place = (), where: str = "") -> Any:
    """What :func:`seal_value` sealed; :data:`ERASED` once the key is gone. Raises :class:`SealError` if altered.

    ``where`` names the member in the error (default: its path in ``place``).
    """
    key_id, _, body = token[SEALED].partition(".")
    key = key_for(key_id)
    if key is None:
        return ERASED
    aad = _aad(run_id, place, path)
    try:
        return loads_strict(_aead(key.secret).decrypt(_nonce(aad), base64.urlsafe_b64decode(body), aad))
    except (InvalidTag, ValueError) as e:
        where = where or f"{'.'.join(map(str, path)) or 'the sealed value'} of {place}"
        raise SealError(f"{where} in run {run_id} does not open under key {key_id}: the record was altered") from e


def seal_event(doc: dict[str, Any], key: DataKey) -> dict[str, Any]:
    """The stored form of ``doc``: every content member sealed under ``key``; sealed members stay as they are.

    The members are those :func:`agentlog.schemas.content.content_members` names, found in one pass that copies only
    the objects it changes (the sequencer seals every event it commits).
    """
    payload = doc.get("payload")
    if payload is None:
        return doc
    stored = _sealed(payload, clear_tree(doc["type"]), (), key, doc["runId"], doc["eventId"])
    return doc if stored is payload else {**doc, "payload": stored}


def _sealed(value: Any, tree: Tree, path: tuple[str, ...], key: DataKey, run_id: str, event_id: str) -> Any:
    """:func:`seal_event`'s pass over ``value`` (its content ``tree``). A function of the module, not a nested one:
    a nested function that calls itself is a reference cycle, which holds the run's data key until a full
    collection, and the worker runs those rarely (:mod:`agentlog.worker.gcpause`)."""
    if is_sealed(value):
        return value
    if not isinstance(value, dict):
        return seal_value(value, key, run_id, event_id, path)
    out: dict[str, Any] | None = None
    for name, member in value.items():
        rule = tree.get(name)
        if rule is True:
            continue
        new = _sealed(member, rule, (*path, name), key, run_id, event_id) \
            if isinstance(rule, Mapping) and isinstance(member, dict) \
            else member if is_sealed(member) else seal_value(member, key, run_id, event_id, (*path, name))
        if new is not member:
            if out is None:
                out = dict(value)
            out[name] = new
    return value if out is None else out


def open_event(doc: dict[str, Any], key_for: Callable[[str], DataKey | None]) -> dict[str, Any]:
    """``doc`` with its sealed members opened; a member whose key is gone reads :data:`ERASED`.

    ``key_for(key_id)`` returns the data key, or ``None`` once it has been erased. Raises :class:`SealError` when a
    token does not open under a key that exists (tampering), since a reader must never show a value it cannot prove.
    """
    payload = doc.get("payload")
    changed = False
    for path, value in list(_walk(doc)):
        if not is_sealed(value):
            continue
        where = f"{'.'.join(('payload', *path))} of event {doc['eventId']}"
        payload = _set(payload, path, open_value(value, key_for, doc["runId"], doc["eventId"], path, where))
        changed = True
    return {**doc, "payload": payload} if changed else doc


def seal_record(record: dict[str, Any], paths: Iterable[Place], key: DataKey | None, run_id: str,
                place: str) -> dict[str, Any]:
    """``record`` with the members at ``paths`` sealed (bound to ``run_id``, ``place`` and the path); without a
    key (erased) they read :data:`ERASED`. Paths that hold nothing (or None) are left alone."""
    out: Any = record
    for path in paths:
        value = _get(out, path)
        if value is None or is_sealed(value):
            continue
        out = _set(out, path, ERASED if key is None else seal_value(value, key, run_id, place, path))
    return dict(out)


def sealed_members(value: Any, path: Place = ()) -> Iterator[tuple[Place, dict[str, str]]]:
    """Every sealed token anywhere in ``value`` (objects and lists), with its path."""
    if is_sealed(value):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from sealed_members(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from sealed_members(v, (*path, i))


def open_record(record: dict[str, Any], key_for: Callable[[str], DataKey | None], run_id: str,
                place: str) -> dict[str, Any]:
    """``record`` with every sealed member opened (:func:`seal_record`'s inverse)."""
    out: Any = record
    for path, token in list(sealed_members(record)):
        out = _set(out, path, open_value(token, key_for, run_id, place, path))
    return dict(out)


def sealed_paths(doc: dict[str, Any], tree: Tree | None = None) -> list[str]:
    """The dotted paths of ``doc``'s sealed members (for diagnostics and tests)."""
    payload = doc.get("payload")
    if payload is None:
        return []
    members = content_members(payload, tree if tree is not None else clear_tree(doc["type"]))
    return [".".join(("payload", *path)) for path, value in members if is_sealed(value)]
