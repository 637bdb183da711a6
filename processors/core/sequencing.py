"""The sequencer's decision for one ingest record, as a pure function.

Kafka has no conditional append, so one processor per partition is the single
writer of the committed log. Its checks are an expected-version check (SPEC §4):
the decision depends only on the run's head (next sequence, head hash), an index
of the run's already committed eventIds, and the record itself. Nothing here
touches Kafka or a clock, so the decision for a redelivered record is the same
decision, byte for byte — that is what makes at-least-once redelivery safe.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from agentlog.core.lifetimes import ClosedMarker, after_close
from agentlog.schemas.canonical import GENESIS, MAX_SAFE_INTEGER, chain_link
from agentlog.schemas.errors import ContractError
from agentlog.schemas.records import (
    CommittedEvent,
    RecordSource,
    Rejection,
    committed_event,
    record_source,
    rejection,
    run_id_of_key,
)
from agentlog.schemas.validate import validate_parsed
from agentlog.streams.codec import decode_ingest


class RunHead(TypedDict):
    """A run's head (from its ``runs`` table record): the sequence expected next and the hash of its last event."""

    next: int
    hash: str


#: A committed eventId's entry in the run's index (the ``index`` table), a JSON array:
#: ``[sequence: int, hash: str, sourcePartition: int, sourceOffset: int]``.
IndexEntry = list[Any]
IndexLookup = Callable[[str], IndexEntry | None]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a record was read from; travels with every output so readers can dedup by position."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    def to_dict(self) -> RecordSource:
        """The ``source`` field of every record made from this position (CommittedEvent, Rejection)."""
        return record_source(topic=self.topic, partition=self.partition, offset=self.offset,
                             timestamp_ms=self.timestamp_ms)


@dataclass(frozen=True, slots=True)
class Accepted:
    committed: CommittedEvent
    head: RunHead  # the run's new head
    index_entry: tuple[str, IndexEntry]  # (eventId, [sequence, hash, sourcePartition, sourceOffset])
    doc_bytes: bytes = b""  # JCS of committed["doc"], as hashed into the chain (reused for the log record)


@dataclass(frozen=True, slots=True)
class Redelivered:
    """The very same source record was already committed: nothing to append."""

    sequence: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """A refused record. ``quotes_content``: ``detail`` may quote what the host sent (a contract error names the
    member or value it refuses), so it is stored sealed; the sequencer's own checks name ids and numbers only."""

    reason: str
    detail: str
    quotes_content: bool = False


@dataclass(frozen=True, slots=True)
class Handled:
    """The record comes before its run's close request: it was handled then, and this is a redelivery."""


Decision = Accepted | Redelivered | Rejected | Handled


#: Turns an accepted doc into its stored form (its content sealed: :func:`agentlog.core.sealing.seal_event`).
Seal = Callable[[dict[str, Any]], dict[str, Any]]


def decide(head: RunHead | None, lookup: IndexLookup, doc: dict[str, Any], source: Source,
           doc_bytes: bytes | None = None, seal: Seal | None = None) -> Decision:
    """Decide what to do with a validated RunEventDoc.

    ``head`` is ``{"next": int, "hash": str}`` or None for a new run; ``lookup(eventId)``
    returns ``[sequence, hash, partition, offset]`` for an already committed event of
    this run, else None; ``doc_bytes`` is the doc's JCS, when the caller has it (computed
    otherwise). Checks run before anything changes (STYLE §3). An accepted doc is chained and
    committed in the form ``seal`` gives it (SPEC §12: the chain covers what is stored).
    """
    event_id = doc["eventId"]
    seen = lookup(event_id)
    if seen is not None:
        if seen[2] == source.partition and seen[3] == source.offset:
            return Redelivered(sequence=seen[0])
        return Rejected(
            "duplicate_event_id",
            f"eventId {event_id} is already committed at sequence {seen[0]} of run {doc['runId']}",
        )
    expected = head["next"] if head else 0
    sequence = doc["sequence"]
    if sequence > expected:
        return Rejected(
            "sequence_gap",
            f"run {doc['runId']}: expected sequence {expected}, got {sequence} (missing {expected}..{sequence - 1})",
        )
    if sequence < expected:
        return Rejected(
            "sequence_conflict",
            f"run {doc['runId']}: sequence {sequence} is already taken (next is {expected})",
        )
    causation = doc.get("causationId")
    if causation is not None and lookup(causation) is None:
        payload = doc.get("payload")
        cross_host = isinstance(payload, dict) and bool(payload.get("causationHostId"))
        if not cross_host:
            return Rejected(
                "dangling_causation",
                f"causationId {causation} names no earlier event of run {doc['runId']}",
            )
    if seal is not None:
        stored = seal(doc)
        if stored is not doc:
            doc, doc_bytes = stored, None
    prev_hash = head["hash"] if head else GENESIS
    digest, doc_bytes = chain_link(prev_hash, doc, doc_bytes)
    return Accepted(
        committed=committed_event(doc=doc, prev_hash=prev_hash, hash=digest, source=source.to_dict()),
        head={"next": sequence + 1, "hash": digest},
        index_entry=(event_id, [sequence, digest, source.partition, source.offset]),
        doc_bytes=doc_bytes,
    )


@dataclass(frozen=True, slots=True)
class Decoded:
    """What :func:`sequence` decoded, beside its decision.

    ``doc`` is None when the record did not decode; ``unexpected`` holds an error no
    contract check anticipated (a bug to log with its traceback, not a reason code).
    """

    doc: dict[str, Any] | None
    decision: Decision
    unexpected: Exception | None = None


def sequence(raw: bytes, head_of: Callable[[str], RunHead | None], lookup_of: Callable[[str], IndexLookup],
             source: Source, *, max_bytes: int,
             closed_of: Callable[[str], ClosedMarker | None] | None = None,
             erased_of: Callable[[str], bool] | None = None, seal: Seal | None = None) -> Decoded:
    """Decode, validate and decide one ingest record: every reason a record is refused, in one place.

    ``head_of(runId)`` is the run's head, ``lookup_of(runId)`` its eventId index lookup. A
    record that does not decode or breaks the contract is ``Rejected`` with the contract's
    code (``bad_magic``, ``decode_error``, ``invalid_envelope``, ``oversize``, …); a valid doc
    gets :func:`decide`'s decision, unless ``closed_of(runId)`` says its run is closed
    (:func:`agentlog.core.lifetimes.after_close`) or ``erased_of(runId)`` that its content was erased
    (``run_erased``). Never raises for a bad record: an unexpected error in
    decoding is a ``decode_error``, in deciding an ``invalid_envelope``, with its type and message.
    """
    doc = None
    try:
        doc = decode_ingest(raw)
        doc_bytes = validate_parsed(doc, max_bytes=max_bytes)
    except ContractError as e:
        return Decoded(doc, Rejected(e.code, getattr(e, "detail", None) or str(e), quotes_content=True))
    except Exception as e:  # a processor never dies on one bad record
        return Decoded(None, Rejected("decode_error", f"{type(e).__name__}: {e}", quotes_content=True), e)
    run_id = doc["runId"]
    try:
        if erased_of is not None and erased_of(run_id):
            return Decoded(doc, Rejected(RUN_ERASED, f"run {run_id} was erased (agentlog erase): it takes no more "
                                                     "events"))
        marker = closed_of(run_id) if closed_of is not None else None
        if marker is not None:
            refused = after_close(marker, run_id, source.offset)
            return Decoded(doc, Handled() if refused is None else Rejected(*refused))
        return Decoded(doc, decide(head_of(run_id), lookup_of(run_id), doc, source, doc_bytes, seal))
    except Exception as e:
        return Decoded(doc, Rejected("invalid_envelope", f"{type(e).__name__}: {e}", quotes_content=True), e)


def rejection_record(
    reason: str, detail: str, raw: bytes, source: Source, doc: dict[str, Any] | None = None,
    key: bytes | None = None,
) -> Rejection:
    """The rejections-topic record (CONTRACT.md): reason, the original bytes and where they came from.

    Its ``runId`` is the doc's; where the doc names none (it did not decode, or its runId is no
    usable string) it is the record's Kafka ``key``, which hosts set to the run id
    (:func:`agentlog.schemas.records.run_id_of_key`).

    The record must always be writable, whatever it rejects: only a JSON-safe sequence and
    ids of a sane length are copied, and an original value over :data:`RAW_MAX_BYTES` (an
    oversize doc grows by a third in base64, past the producer's and topic's size limit) is
    kept as its first RAW_MAX_BYTES with ``rawTruncated``, ``rawBytes`` and ``rawSha256``.
    """
    doc = doc if isinstance(doc, dict) else {}
    seq = doc.get("sequence")

    def ident(name: str) -> str | None:
        value = doc.get(name)
        return value if isinstance(value, str) and 0 < len(value) <= _ID_MAX else None

    truncated = len(raw) > RAW_MAX_BYTES
    return rejection(
        reason=reason,
        detail=detail[:2000],
        run_id=ident("runId") or run_id_of_key(key),
        event_id=ident("eventId"),
        sequence=seq if type(seq) is int and -MAX_SAFE_INTEGER <= seq <= MAX_SAFE_INTEGER else None,
        source=source.to_dict(),
        raw=base64.b64encode(raw[:RAW_MAX_BYTES]).decode("ascii"),
        raw_bytes=len(raw) if truncated else None,
        raw_sha256=hashlib.sha256(raw).hexdigest() if truncated else None,
    )


#: A rejection's original bytes are sealed under the data key of ``rejections/<runId>`` (a keyring entry whose
#: parent is the run, so erasing the run reaches them), or of ``rejections/~<topic>/<partition>`` when no run is
#: named; the associated data names the record by its position (:func:`rejection_sealing`).
REJECTIONS_PREFIX = "rejections/"

#: The members of a rejection that can be a host's content, sealed each at its own path: the original bytes, and the
#: detail where it quotes them (:attr:`Rejected.quotes_content`).
REJECTION_CONTENT = ("raw", "detail")

#: The topic (short name) whose rejections are filed by run: the sequencer is the one writer of a run's ingest records.
_BY_RUN = "ingest"


def rejection_sealing(rejected: Mapping[str, Any]) -> tuple[str, str]:
    """The keyring entry a rejection's original bytes are sealed under, and the place they are bound to (the
    position of the record they were), from the rejection record itself: its writer seals, readers open.

    A key has one writer, the one agent that reads the rejection's source partition. The sequencer reads every
    record of a run, so its rejections of a run share ``rejections/<runId>``. An agent before it (the span mapper on
    ``spans``, the OTel run sequencer on ``otel-events``) reads a run's records on several partitions, so its key is
    that of its partition and the run, ``rejections/~<topic>/<partition>/<runId>``. Without a run, it is the
    partition's, ``rejections/~<topic>/<partition>``.
    """
    source = rejected["source"]
    run_id = rejected.get("runId")
    topic, partition = source["topic"], source["partition"]
    place = f"{topic}:{partition}:{source['offset']}"
    if run_id and topic.rsplit(".", 1)[-1] == _BY_RUN:
        return REJECTIONS_PREFIX + run_id, place
    own = f"{REJECTIONS_PREFIX}~{topic}/{partition}"
    return (f"{own}/{run_id}" if run_id else own), place


#: The reason of an event whose run was erased: its key is gone, so nothing of it can be stored any more.
RUN_ERASED = "run_erased"

#: Largest original value a rejection record carries whole (see :func:`rejection_record`).
RAW_MAX_BYTES = 256 * 1024
_ID_MAX = 256
