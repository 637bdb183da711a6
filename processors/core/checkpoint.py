"""Signed checkpoints: what the worker's signature over a run's history says, and how a history is checked.

The hash chain makes a run tamper-*evident* only to someone who kept the head hash: anyone who
can write the log (or the audit tables) can rewrite an event and recompute every ``hash`` and
``stateHash`` after it, and the result is a consistent chain. A checkpoint closes that gap: the
worker signs ``(runId, sequence, headHash, stateHash)`` with its Ed25519 key, and a forger
without the private key cannot make a signature for the rewritten head.

Pure (no Kafka, ClickHouse or Faust): the worker signs here, ``agentlog verify`` checks here, on
the same canonical bytes. ``cryptography`` does no I/O; keys come in as PEM bytes and files are
read and written by the callers (:mod:`agentlog.worker.signing`, :mod:`agentlog.cli.verify`).

* **Statement**: the JCS (RFC 8785) bytes of ``{purpose, runId, sequence, headHash, stateHash,
  keyId}``. ``purpose`` (:data:`PURPOSE`) separates these signatures from anything else the same
  key might ever sign. No timestamp: Ed25519 (RFC 8032) is deterministic, so a batch redelivered
  after a crash re-signs to the byte-identical record and readers dedup it by bytes.
* **Key id**: lowercase hex SHA-256 of the raw 32-byte Ed25519 public key (:func:`key_id`). It
  travels in the statement, so after a key rotation old checkpoints name the old key and the
  verifier, given every public key in use, picks the right one.
* **What verification checks** (:func:`verify_history`, stops at the first failure): contiguous
  sequences from 0; a log record's ``prevHash``/``hash`` and ``stateHash`` (the chain check; a bare
  doc from an export carries none of them); at every checkpoint, the signature with a known key and the recomputed
  head and state hash; a checkpoint at every terminal event (else deleting the run's last
  checkpoints would go unnoticed); no checkpoint beyond the history (else truncation would); and,
  unless allowed, no event after the last checkpoint (the "unsigned tail").
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentlog.core.fold import fold
from agentlog.core.runstate import TERMINAL_TYPES
from agentlog.core.statehash import StateHasher
from agentlog.schemas.canonical import GENESIS, chain_hash, jcs, sha256_hex
from agentlog.schemas.errors import AgentlogError
from agentlog.schemas.records import Checkpoint, checkpoint, log_format_error

__all__ = [
    "PURPOSE",
    "CheckpointKeyError",
    "VerifyFailure",
    "VerifyResult",
    "generate_private_key",
    "is_due",
    "key_id",
    "load_private_key",
    "load_public_key",
    "private_key_pem",
    "public_key_path",
    "public_key_pem",
    "sign_checkpoint",
    "statement_bytes",
    "verify_checkpoint",
    "verify_history",
]

#: Domain separation: the first thing a signed statement says is what it is.
PURPOSE = "agentlog/checkpoint/v1"

#: Stable failure codes of :func:`verify_history` (CLI ``--json``, the README's table).
FailureCode = Literal[
    "empty_history", "log_gap", "wrong_run", "bad_event", "hash_chain_broken", "state_hash_mismatch", "bad_checkpoint",
    "unknown_key", "signature_invalid", "checkpoint_mismatch", "terminal_checkpoint_missing",
    "checkpoint_beyond_history", "unsigned_tail", "erasure_receipt_invalid",
]


class CheckpointKeyError(AgentlogError):
    """A signing or public key cannot be read; the message names the file's expected form."""

    code = "checkpoint_key_invalid"


# -- keys ---------------------------------------------------------------------------------------


def generate_private_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key (the worker makes one on first start when none exists)."""
    return Ed25519PrivateKey.generate()


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted: the key file is protected by its 0600 mode."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    """SubjectPublicKeyInfo PEM (``openssl pkey -pubout`` writes the same)."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(pem: bytes, *, where: str = "the signing key") -> Ed25519PrivateKey:
    """An Ed25519 private key from PKCS#8 PEM.

    Raises:
        CheckpointKeyError: not PEM, encrypted, or not an Ed25519 key.
    """
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise CheckpointKeyError(f"{where} is not an unencrypted PKCS#8 PEM private key ({e})") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise CheckpointKeyError(f"{where} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(pem: bytes, *, where: str = "the public key") -> Ed25519PublicKey:
    """An Ed25519 public key from SubjectPublicKeyInfo PEM (the worker's ``ed25519.pub.pem``).

    Raises:
        CheckpointKeyError: not PEM, or not an Ed25519 key.
    """
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        raise CheckpointKeyError(f"{where} is not a PEM public key ({e}); give the worker's ed25519.pub.pem") from e
    if not isinstance(key, Ed25519PublicKey):
        raise CheckpointKeyError(f"{where} is a {type(key).__name__}, not an Ed25519 key")
    return key


def public_key_path(private: Path) -> Path:
    """Where the public half of a key file is written: ``…/ed25519.pem`` → ``…/ed25519.pub.pem``."""
    name = private.name[:-4] if private.name.endswith(".pem") else private.name
    return private.with_name(f"{name}.pub.pem")


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 (lowercase hex) of the raw 32-byte public key: the same id for a key's both halves."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return sha256_hex(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


# -- one checkpoint -----------------------------------------------------------------------------


def is_due(sequence: int, event_type: str, every: int) -> bool:
    """Whether the worker signs at this event: every ``every`` events (sequences every-1, 2·every-1, …)
    and at every terminal event. ``every`` <= 0 leaves only the terminal ones."""
    return event_type in TERMINAL_TYPES or (every > 0 and (sequence + 1) % every == 0)


def statement_bytes(*, run_id: str, sequence: int, head_hash: str, state_hash: str, key: str) -> bytes:
    """The bytes a checkpoint's signature covers: JCS of the statement (module docstring)."""
    return jcs({"purpose": PURPOSE, "runId": run_id, "sequence": sequence, "headHash": head_hash,
                "stateHash": state_hash, "keyId": key})


def sign_checkpoint(key: Ed25519PrivateKey, *, run_id: str, sequence: int, head_hash: str,
                    state_hash: str, kid: str | None = None) -> Checkpoint:
    """A signed Checkpoint record. ``kid``: :func:`key_id` of ``key``, when the caller has it already."""
    kid = kid or key_id(key)
    data = statement_bytes(run_id=run_id, sequence=sequence, head_hash=head_hash, state_hash=state_hash, key=kid)
    return checkpoint(run_id=run_id, sequence=sequence, head_hash=head_hash, state_hash=state_hash, key_id=kid,
                      signature=base64.b64encode(key.sign(data)).decode("ascii"))


def verify_checkpoint(record: Mapping[str, Any], keys: Mapping[str, Ed25519PublicKey]) -> FailureCode | None:
    """None when ``record``'s signature is valid under the key it names; else why not.

    ``bad_checkpoint`` (a field missing or of the wrong type), ``unknown_key`` (no key in ``keys``
    has its id), ``signature_invalid`` (the signature does not cover these fields under that key).
    """
    try:
        run_id, seq, head, state, kid, sig = (record["runId"], record["sequence"], record["headHash"],
                                              record["stateHash"], record["keyId"], record["signature"])
    except (KeyError, TypeError):
        return "bad_checkpoint"
    if not (isinstance(run_id, str) and type(seq) is int and isinstance(head, str) and isinstance(state, str)
            and isinstance(kid, str) and isinstance(sig, str)):
        return "bad_checkpoint"
    public = keys.get(kid)
    if public is None:
        return "unknown_key"
    try:
        signature = base64.b64decode(sig, validate=True)
        public.verify(signature, statement_bytes(run_id=run_id, sequence=seq, head_hash=head, state_hash=state,
                                                 key=kid))
    except (InvalidSignature, binascii.Error, ValueError):
        return "signature_invalid"
    return None


# -- a whole history ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyFailure:
    """The first thing that failed. ``at_sequence`` is the first index no valid signature vouches for:
    the failing index itself for a chain, state or gap failure, the index after the last verified
    checkpoint for a failed checkpoint (a signature covers a prefix, so a forgery is only located to
    the span ``at_sequence..checkpoint_sequence``)."""

    code: FailureCode
    at_sequence: int
    detail: str
    checkpoint_sequence: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {"code": self.code, "atSequence": self.at_sequence, "checkpointSequence": self.checkpoint_sequence,
                "detail": self.detail}


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """What :func:`verify_history` found. ``verified`` iff ``failure`` is None."""

    run_id: str
    events: int  # events checked (on a failure: those before the point of failure); ``head_hash`` is theirs
    checkpoints_verified: int
    last_signed: int | None  # the highest sequence a verified checkpoint covers
    head_hash: str
    key_ids: tuple[str, ...]  # keys that signed the verified checkpoints
    unsigned_tail: tuple[int, int] | None  # first and last sequence after the last verified checkpoint
    failure: VerifyFailure | None
    notes: tuple[str, ...] = field(default=())

    @property
    def verified(self) -> bool:
        return self.failure is None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "runId": self.run_id, "verified": self.verified, "events": self.events,
            "checkpointsVerified": self.checkpoints_verified, "lastSigned": self.last_signed,
            "headHash": self.head_hash, "keyIds": list(self.key_ids),
            "unsignedTail": ({"from": self.unsigned_tail[0], "to": self.unsigned_tail[1]}
                             if self.unsigned_tail else None),
            "failure": self.failure.to_json_dict() if self.failure else None, "notes": list(self.notes),
        }


def verify_history(
    run_id: str,
    records: Sequence[Mapping[str, Any]],
    checkpoints: Iterable[Mapping[str, Any]],
    keys: Mapping[str, Ed25519PublicKey],
    *,
    handoff_mode: str = "auto",
    allow_unsigned_tail: bool = False,
) -> VerifyResult:
    """Check a run's history against its signed checkpoints; pure, fail-fast.

    ``records`` are the run's events in sequence order, each a bare RunEventDoc (an export) or a
    CommittedEvent (``doc`` + ``prevHash``/``hash``/``stateHash``, read from the log); only what a
    record carries is checked against the recomputation, and the recomputation (chain from
    GENESIS, the one fold with ``handoff_mode``, as the worker ran it) is what the signatures are
    compared with, so nothing a forger can rewrite is trusted. ``checkpoints`` may repeat and
    come in any order; ``keys`` maps :func:`key_id` to public key.

    Raises:
        LogFormatError: a CommittedEvent without ``stateHash`` (log format 1), which this version
            does not verify.
    """
    by_seq: dict[int, list[Mapping[str, Any]]] = {}
    seen: set[bytes] = set()
    for cp in checkpoints:
        if cp.get("runId") != run_id:
            continue
        ident = jcs(dict(cp))
        if ident in seen:
            continue  # a redelivered record: byte-identical
        seen.add(ident)
        seq = cp.get("sequence")
        by_seq.setdefault(seq if type(seq) is int and seq >= 0 else -1, []).append(cp)

    head, state, hasher = GENESIS, None, StateHasher()
    last_signed: int | None = None
    verified = 0
    kids: list[str] = []
    notes: list[str] = []

    def result(failure: VerifyFailure | None, events: int, tail: tuple[int, int] | None = None) -> VerifyResult:
        return VerifyResult(run_id=run_id, events=events, checkpoints_verified=verified, last_signed=last_signed,
                            head_hash=head, key_ids=tuple(kids), unsigned_tail=tail, failure=failure,
                            notes=tuple(notes))

    def unvouched() -> int:
        return 0 if last_signed is None else last_signed + 1

    if -1 in by_seq:
        return result(VerifyFailure("bad_checkpoint", 0, "a checkpoint of this run has no integer sequence"), 0)
    if not records:
        return result(VerifyFailure("empty_history", 0, f"no events of run {run_id} to verify"), 0)

    for index, rec in enumerate(records):
        committed = isinstance(rec.get("doc"), dict)
        if committed and "stateHash" not in rec:
            raise log_format_error(rec)
        doc: Mapping[str, Any] = rec["doc"] if committed else rec
        if doc.get("runId") != run_id:
            return result(VerifyFailure("wrong_run", index, f"event {index} belongs to run {doc.get('runId')!r}"),
                          index)
        if doc.get("sequence") != index:
            return result(VerifyFailure("log_gap", index, f"expected sequence {index}, found {doc.get('sequence')!r}: "
                                        "an event is missing or out of order"), index)
        try:
            new_head = chain_hash(head, dict(doc))
            state, _ = fold(state, doc, handoff_mode=handoff_mode)
        except Exception as e:  # an unvalidated doc from a file: not something the worker committed
            return result(VerifyFailure("bad_event", index, f"event {index} cannot be hashed or folded: {e}"), index)
        if committed and (rec.get("prevHash") != head or rec.get("hash") != new_head):
            return result(VerifyFailure("hash_chain_broken", index, (
                f"record {index} carries prevHash {rec.get('prevHash')} / hash {rec.get('hash')}, its doc chains to "
                f"{head} / {new_head}")), index)
        head = new_head
        due = by_seq.get(index, [])
        recorded_state = rec.get("stateHash") if committed else None
        state_hash = hasher(state) if (due or recorded_state is not None) else None
        if recorded_state is not None and recorded_state != state_hash:
            return result(VerifyFailure("state_hash_mismatch", index, (
                f"record {index} carries stateHash {recorded_state}, its fold gives {state_hash}")), index)
        for cp in due:
            problem = verify_checkpoint(cp, keys)
            if problem is None and (cp["headHash"] != head or cp["stateHash"] != state_hash):
                problem = "checkpoint_mismatch"
            if problem is not None:
                return result(VerifyFailure(problem, unvouched(), _checkpoint_detail(problem, cp, head, state_hash),
                                            checkpoint_sequence=index), index + 1)
            verified += 1
            if cp["keyId"] not in kids:
                kids.append(cp["keyId"])
        if due:
            last_signed = index
        elif doc.get("type") in TERMINAL_TYPES:
            return result(VerifyFailure("terminal_checkpoint_missing", unvouched(), (
                f"event {index} is {doc.get('type')} but no checkpoint signs it: the worker signs every terminal "
                "event, so its checkpoint was deleted (or this run ended behind the worker's back)"),
                checkpoint_sequence=index), index + 1)

    events = len(records)
    beyond = sorted(s for s in by_seq if s >= events)
    if beyond:
        return result(VerifyFailure("checkpoint_beyond_history", events, (
            f"checkpoint(s) at sequence {', '.join(map(str, beyond))} but the history ends at {events - 1}: "
            "events were removed from its end")), events)
    tail = (unvouched(), events - 1) if unvouched() < events else None
    if tail is not None and not allow_unsigned_tail:
        return result(VerifyFailure("unsigned_tail", tail[0], (
            f"events {tail[0]}..{tail[1]} come after the last checkpoint; no signature covers them "
            "(a run still in progress; pass --allow-unsigned-tail to accept that)")), events, tail)
    if tail is not None:
        notes.append(f"unsigned tail: events {tail[0]}..{tail[1]} (allowed)")
    return result(None, events, tail)


def _checkpoint_detail(problem: str, cp: Mapping[str, Any], head: str, state_hash: str | None) -> str:
    seq, kid = cp.get("sequence"), str(cp.get("keyId"))
    if problem == "unknown_key":
        return f"checkpoint at {seq} is signed by key {kid}, which is not among the public keys given"
    if problem == "signature_invalid":
        return f"checkpoint at {seq}: the signature of key {kid} does not cover its fields (the record was altered)"
    if problem == "bad_checkpoint":
        return f"checkpoint at {seq} lacks a field or has one of the wrong type"
    which = "headHash" if cp.get("headHash") != head else "stateHash"
    signed, found = (cp.get("headHash"), head) if which == "headHash" else (cp.get("stateHash"), state_hash)
    return (f"checkpoint at {seq} (key {kid[:16]}…) signs {which} {signed}, the history gives {found}: "
            "an event at or before it was rewritten")
