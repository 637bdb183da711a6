"""The records our processors write to internal topics (CONTRACT.md), one type and one builder each.

A record's bytes are its identity: values are JCS-encoded, redelivery is
deduplicated by byte equality and a store written by an earlier version of the
same log format must stay readable. So which keys a record has — and which it leaves out — is part
of the contract, and each shape is built in exactly one place: the builder
below. Producers pass values; they never write a record literal of their own.

Key order is irrelevant (JCS sorts keys); the set of keys is not. A key the
contract shows as ``|null`` is always present, None when it has no value; only
the keys declared ``NotRequired`` are ever absent, and each builder's docstring
says when.

The shapes are written in the functional ``TypedDict`` form: Transition has keys
named ``from`` and ``to``, and Python 3.11 drops ``NotRequired`` from a class-form
TypedDict under ``from __future__ import annotations`` (the annotation is a string
it does not evaluate), which would declare an optional key required. Hence ruff's UP013
(rewrite to the class form) is switched off for this file below.

A Violation's ``runId``/``eventId``/``sequence`` are typed nullable: the fold reports a
violation on whatever event it was given, and ``agentlog compare`` folds events read from a
user's file, unvalidated. The live processors only fold validated docs, where all three are set.
"""

# ruff: noqa: UP013 - the functional TypedDict form is deliberate (module docstring)

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from agentlog.schemas.errors import LogFormatError

__all__ = [
    "Checkpoint",
    "CommittedEvent",
    "RecordSource",
    "Rejection",
    "RunSnapshot",
    "Transition",
    "Verdict",
    "VerdictKind",
    "Violation",
    "committed_event",
    "log_format_error",
    "record_source",
    "rejection",
    "run_id_of_key",
    "run_snapshot",
    "transition",
    "checkpoint",
    "verdict",
    "violation",
]

#: Where the sequencer read a record (the ``source`` of CommittedEvent and Rejection): a reader
#: dedups by this position, and the audit store shows when the record arrived (``timestampMs``).
RecordSource = TypedDict("RecordSource", {
    "topic": str,
    "partition": int,
    "offset": int,
    "timestampMs": int,
})

#: One event of the committed log (topic ``log``): the doc as ingested, chained to its run's
#: previous event, and where it was read from.
class _CommittedEventChain(TypedDict):
    doc: dict[str, Any]
    prevHash: str
    hash: str
    source: RecordSource


class CommittedEvent(_CommittedEventChain, total=False):
    """A committed log record: every record in the log carries ``stateHash`` (log format 2).

    The key is optional in the type for one value only: the sequencer's decision
    (:func:`committed_event` without ``state_hash``), made before the event is folded and never
    written as it is. A record read from the log without it is log format 1 (:func:`log_format_error`).
    """

    stateHash: str

#: A refused ingest record (topic ``rejections``); ``raw*`` keys only when ``raw`` is a prefix.
Rejection = TypedDict("Rejection", {
    "reason": str,
    "detail": str,
    "runId": str | None,
    "eventId": str | None,
    "sequence": int | None,
    "source": RecordSource,
    "raw": str,
    "rawTruncated": NotRequired[Literal[True]],
    "rawBytes": NotRequired[int],
    "rawSha256": NotRequired[str],
})

#: One move of a handoff machine (topic ``transitions``), host-emitted (checked) or derived.
Transition = TypedDict("Transition", {
    "parentRunId": str,
    "workerId": str,
    "dispatchId": str,
    "childRunId": str | None,
    "phase": str,
    "from": str,
    "to": str,
    "eventId": str,
    "causationId": str | None,
    "sequence": int | None,
    "derived": bool,
    "timestamp": str,
    "harvestedKeys": list[str] | None,
    "error": dict[str, Any] | None,
})

#: A broken rule found while folding or re-checking a run (topic ``violations``).
Violation = TypedDict("Violation", {
    "runId": str | None,
    "code": str,
    "detail": str,
    "eventId": str | None,
    "sequence": int | None,
    "workerId": str | None,
    "phase": str | None,
    "dispatchId": str | None,
})

#: A run's folded state at one sequence (topic ``snapshots``, compacted by runId).
RunSnapshot = TypedDict("RunSnapshot", {
    "runId": str,
    "atSequence": int,
    "logPartition": int,
    "logOffset": int,
    "state": dict[str, Any],
    "stateHash": str,
    "headHash": str,
})

#: A signed statement over a run's history up to ``sequence`` (topic ``checkpoints``):
#: the worker's Ed25519 signature (base64) over the JCS statement that
#: :func:`agentlog.core.checkpoint.statement_bytes` builds from the other fields.
Checkpoint = TypedDict("Checkpoint", {
    "runId": str,
    "sequence": int,
    "headHash": str,
    "stateHash": str,
    "keyId": str,
    "signature": str,
})

#: The answer a Verdict gives: the comparison engine's verdicts, or ``error`` when none could be made.
VerdictKind = Literal["match", "diverged", "diverged_at_refusal", "what-if", "error"]

#: A host replay compared with its source (topic ``verdicts``).
Verdict = TypedDict("Verdict", {
    "replayRunId": str,
    "sourceRunId": str | None,
    "mode": str,
    "verdict": VerdictKind,
    "errorCode": str | None,
    "firstDivergence": dict[str, Any] | None,
    "events": list[dict[str, Any]],
    "comparedThrough": int | None,
    "bindingDiff": NotRequired[dict[str, dict[str, Any]]],
    "detail": NotRequired[str],
    "reordered": NotRequired[list[dict[str, Any]]],
    "path": NotRequired[list[dict[str, Any]]],
})


def record_source(*, topic: str, partition: int, offset: int, timestamp_ms: int) -> RecordSource:
    """The ``source`` of a record the sequencer wrote, so its readers can dedup by position."""
    return {"topic": topic, "partition": partition, "offset": offset, "timestampMs": timestamp_ms}


def committed_event(*, doc: dict[str, Any], prev_hash: str, hash: str, source: RecordSource,
                    state_hash: str | None = None) -> CommittedEvent:
    """A CommittedEvent; the doc travels unchanged, the chain and position beside it.

    Nothing is added inside ``doc`` so an exported event still validates upstream;
    ``hash`` must be ``chain_hash(prev_hash, doc)``, which every reader re-checks.
    ``state_hash`` is the state hash after folding this event, which every log record carries.
    Without it the key is absent: the sequencer's decision, made before the fold, is built that
    way and is never written to the log as it is.
    """
    record: CommittedEvent = {"doc": doc, "prevHash": prev_hash, "hash": hash, "source": source}
    if state_hash is not None:
        record["stateHash"] = state_hash
    return record


def log_format_error(committed: Mapping[str, Any], *, partition: int | None = None,
                     offset: int | None = None) -> LogFormatError:
    """The error a reader raises for a log record without ``stateHash`` (log format 1), saying where it is.

    Readers check ``"stateHash" in record`` themselves (it is on their hot path) and build the
    error here, so every reader words it the same way.
    """
    doc = committed.get("doc")
    where = []
    if isinstance(doc, dict):
        if isinstance(doc.get("runId"), str):
            where.append(f"run {doc['runId']}")
        if type(doc.get("sequence")) is int:
            where.append(f"sequence {doc['sequence']}")
    if offset is not None:
        where.append(f"log offset {offset}" + (f" in partition {partition}" if partition is not None else ""))
    return LogFormatError("log record " + ", ".join(where) if where else "a log record")


def rejection(
    *,
    reason: str,
    detail: str,
    run_id: str | None,
    event_id: str | None,
    sequence: int | None,
    source: RecordSource,
    raw: str,
    raw_bytes: int | None = None,
    raw_sha256: str | None = None,
) -> Rejection:
    """A Rejection; ``raw`` is the base64 of the original value, or of its first bytes.

    When ``raw`` holds only a prefix, ``raw_bytes`` (the full length) and ``raw_sha256``
    (of the full value) say so and let the original be recognised; the record then also
    carries ``rawTruncated: true``. Without them those keys are absent, not null, so a
    rejection of a small value has the bytes it had before truncation existed.

    Raises:
        TypeError: only one of ``raw_bytes`` and ``raw_sha256`` was given (a caller bug:
            a truncation that cannot be checked).
    """
    if (raw_bytes is None) != (raw_sha256 is None):
        raise TypeError("rejection() needs raw_bytes and raw_sha256 together: both describe one truncated value")
    record: Rejection = {
        "reason": reason,
        "detail": detail,
        "runId": run_id,
        "eventId": event_id,
        "sequence": sequence,
        "source": source,
        "raw": raw,
    }
    if raw_bytes is not None and raw_sha256 is not None:
        record["rawTruncated"] = True
        record["rawBytes"] = raw_bytes
        record["rawSha256"] = raw_sha256
    return record


#: The longest run id a rejection takes from a record's key: the bound it applies to ids copied from a doc.
KEY_RUN_ID_MAX = 256


def run_id_of_key(key: bytes | None) -> str | None:
    """The run id a rejected record's Kafka key names: the key as UTF-8, None when it names none.

    Hosts key ingest records by run id (UTF-8, as the SDK and the murmur2 partitioner encode it),
    so a record whose value is unreadable still says whose it is. A key that is absent, empty,
    longer than :data:`KEY_RUN_ID_MAX` characters or not valid UTF-8 gives None: no run id is
    such a string, and a guess (a lossy decoding) would file the rejection under a run that
    does not exist: the rejection then has no run id, and its ``raw`` value is all it keeps.
    """
    if not key:
        return None
    try:
        run_id = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return run_id if len(run_id) <= KEY_RUN_ID_MAX else None


def transition(
    *,
    parent_run_id: str,
    worker_id: str,
    dispatch_id: str,
    child_run_id: str | None,
    phase: str,
    from_state: str,
    to_state: str,
    event_id: str,
    causation_id: str | None,
    sequence: int | None,
    derived: bool,
    timestamp: str,
    harvested_keys: list[str] | None = None,
    error: dict[str, Any] | None = None,
) -> Transition:
    """A Transition, checked or derived; both kinds have the same keys so one table holds them.

    ``from_state``/``to_state`` are the phase's row of SPEC §5 (the caller owns that table).
    ``harvested_keys`` and ``error`` stay present as null when a phase has none, as the
    contract shows them. A derived transition has ``sequence`` None: it is no event of the log.
    """
    return {
        "parentRunId": parent_run_id,
        "workerId": worker_id,
        "dispatchId": dispatch_id,
        "childRunId": child_run_id,
        "phase": phase,
        "from": from_state,
        "to": to_state,
        "eventId": event_id,
        "causationId": causation_id,
        "sequence": sequence,
        "derived": derived,
        "timestamp": timestamp,
        "harvestedKeys": harvested_keys,
        "error": error,
    }


def violation(
    *,
    run_id: str | None,
    code: str,
    detail: str,
    event_id: str | None,
    sequence: int | None,
    worker_id: str | None = None,
    phase: str | None = None,
    dispatch_id: str | None = None,
) -> Violation:
    """A Violation: a broken rule as a value with a stable ``code``, tied to the event that broke it.

    The handoff fields stay present as null for the run-state processor's chain checks
    (``log_gap``, ``hash_chain_broken``), so every violation has one set of keys.
    ``run_id``, ``event_id`` and ``sequence`` are the offending event's, null where that
    event has none (only an unvalidated doc, as ``agentlog compare`` may fold, lacks them).
    """
    return {
        "runId": run_id,
        "code": code,
        "detail": detail,
        "eventId": event_id,
        "sequence": sequence,
        "workerId": worker_id,
        "phase": phase,
        "dispatchId": dispatch_id,
    }


def run_snapshot(
    *,
    run_id: str,
    at_sequence: int,
    log_partition: int,
    log_offset: int,
    state: dict[str, Any],
    state_hash: str,
    head_hash: str,
) -> RunSnapshot:
    """A RunSnapshot: the state after ``at_sequence``, plus where to resume reading the log.

    ``log_partition``/``log_offset`` are the committed event's position, so a rebuild
    folds from ``log_offset + 1``; ``state_hash`` and ``head_hash`` let it check the
    snapshot against the log record at ``at_sequence`` (its stateHash and hash) before trusting it.
    """
    return {
        "runId": run_id,
        "atSequence": at_sequence,
        "logPartition": log_partition,
        "logOffset": log_offset,
        "state": state,
        "stateHash": state_hash,
        "headHash": head_hash,
    }


def checkpoint(*, run_id: str, sequence: int, head_hash: str, state_hash: str, key_id: str,
               signature: str) -> Checkpoint:
    """A Checkpoint. Only :func:`agentlog.core.checkpoint.sign_checkpoint` calls this, with the signature
    it made over exactly these fields; no timestamp, so a re-signed redelivery is byte-identical."""
    return {
        "runId": run_id,
        "sequence": sequence,
        "headHash": head_hash,
        "stateHash": state_hash,
        "keyId": key_id,
        "signature": signature,
    }


def verdict(
    *,
    replay_run_id: str,
    source_run_id: str | None,
    mode: str,
    verdict: VerdictKind,
    error_code: str | None,
    first_divergence: dict[str, Any] | None,
    events: list[dict[str, Any]],
    compared_through: int | None,
    binding_diff: dict[str, dict[str, Any]] | None = None,
    detail: str | None = None,
    reordered: list[dict[str, Any]] | None = None,
    path: list[dict[str, Any]] | None = None,
) -> Verdict:
    """A Verdict, including the ``error`` verdict of a comparison that could not be made.

    ``bindingDiff`` is added only when some bound version differs (a what-if must say
    which, MACP §3) and ``detail`` only when given (error verdicts say why): a plain
    verdict keeps the keys it has always had, so a redelivered one stays byte-identical.
    ``reordered`` (events a per-lane comparison found interleaved differently) and ``path``
    (the run-tree hops to a divergence inside a child run) are likewise added only when non-empty.
    """
    record: Verdict = {
        "replayRunId": replay_run_id,
        "sourceRunId": source_run_id,
        "mode": mode,
        "verdict": verdict,
        "errorCode": error_code,
        "firstDivergence": first_divergence,
        "events": events,
        "comparedThrough": compared_through,
    }
    if binding_diff:
        record["bindingDiff"] = binding_diff
    if detail is not None:
        record["detail"] = detail
    if reordered:
        record["reordered"] = reordered
    if path:
        record["path"] = path
    return record
