"""Map internal records (the :mod:`agentlog.schemas.records` shapes) to ClickHouse rows.

Pure functions, no I/O: the sink and the tests share them, and a row is a
deterministic function of its record (a re-formed sink batch is the same rows, and
the same insert deduplication token drops it). Missing optional
fields become ``''`` rather than NULL (ClickHouse reads plain columns faster
and the queries never have to tell "absent" from "empty").

Each ``*_rows(records)`` returns ``(column_names, columns)``: column-oriented
data, one list per column, ready for ``client.insert(..., column_oriented=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from agentlog.schemas.canonical import jcs, jcs_parsed, jcs_parsed_and_member, sha256_hex
from agentlog.schemas.errors import LogFormatError, StoreError
from agentlog.schemas.records import (
    Checkpoint,
    CommittedEvent,
    Rejection,
    RunSnapshot,
    Transition,
    Verdict,
    Violation,
    log_format_error,
)

__all__ = [
    "COLUMNS",
    "TABLE_FOR_KIND",
    "ROWS_FOR_KIND",
    "committed_rows",
    "transition_rows",
    "violation_rows",
    "rejection_rows",
    "snapshot_rows",
    "verdict_rows",
    "checkpoint_rows",
    "rows_for",
    "parse_timestamp",
]

Columns = tuple[tuple[str, ...], list[list[Any]]]
#: A ``*_rows`` function; the record type follows from the kind, which is only known at run time.
RowMapper = Callable[[Iterable[Any]], Columns]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

COLUMNS: dict[str, tuple[str, ...]] = {
    "events": (
        "run_id", "sequence", "event_id", "causation_id", "type", "node_id", "event_time",
        "ingested_at", "source_topic", "kafka_partition", "kafka_offset", "hash", "prev_hash",
        "payload", "doc", "state_hash",
    ),
    "transitions": (
        "parent_run_id", "dispatch_id", "phase", "worker_id", "child_run_id", "from_state",
        "to_state", "event_id", "causation_id", "sequence", "derived", "event_time",
        "harvested_keys", "error_code", "error", "doc",
    ),
    "violations": (
        "run_id", "sequence", "event_id", "code", "detail", "worker_id", "phase", "dispatch_id", "doc",
    ),
    "rejections": (
        "source_topic", "source_partition", "source_offset", "reason", "detail", "run_id",
        "event_id", "sequence", "source_time", "raw", "doc",
    ),
    "snapshots": (
        "run_id", "at_sequence", "log_partition", "log_offset", "state", "state_hash", "head_hash",
    ),
    "replay_verdicts": (
        "source_run_id", "replay_run_id", "record_hash", "mode", "verdict", "error_code",
        "compared_through", "first_divergence", "events", "doc",
    ),
    # signed checkpoints (migration 0004)
    "checkpoints": (
        "run_id", "sequence", "key_id", "head_hash", "state_hash", "signature", "doc",
    ),
}


def parse_timestamp(value: Any, fallback_ms: int | None = None) -> datetime:
    """An RFC 3339 timestamp (or epoch milliseconds) as an aware UTC datetime.

    The contract validates timestamps at ingest, so a bad one here is a record
    from a foreign writer; it falls back to ``fallback_ms`` (the Kafka
    timestamp) or the epoch instead of failing the whole batch.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None:
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    if fallback_ms is not None:
        return datetime.fromtimestamp(fallback_ms / 1000.0, tz=UTC)
    return _EPOCH


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _sealable(value: Any) -> str:
    """A text member that is stored sealed (a token, kept as its JCS text) or as it is."""
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    """JCS text of a value; ``''`` for None so "no value" stays cheap to test for."""
    return "" if value is None else jcs(value).decode("utf-8")


def _record_doc(rec: Mapping[str, Any]) -> str:
    """JCS of the record itself, without transport annotations (``_position`` and other ``_`` keys)."""
    return _json({k: v for k, v in rec.items() if not k.startswith("_")})


def _columnar(table: str, rows: Iterable[tuple[Any, ...]]) -> Columns:
    names = COLUMNS[table]
    rows = list(rows)
    if not rows:
        return names, [[] for _ in names]
    cols = [list(col) for col in zip(*rows, strict=True)]  # transposed in C
    if len(cols) != len(names):
        raise ValueError(f"{table} rows have {len(cols)} values, the table {len(names)} columns")
    return names, cols


def _source(rec: CommittedEvent | Rejection) -> Mapping[str, Any]:
    return rec.get("source") or {}


def _payload_and_doc(doc: Mapping[str, Any]) -> tuple[str, str]:
    """JCS of the payload and of the whole doc, canonicalising the payload once.

    The doc is canonicalised with a one-character stand-in for the payload, which is
    then replaced by the payload's text: JCS places a member by its name alone, and the
    unescaped ``"payload":0`` can only be that member (a quote inside any string is
    written ``\\"``). The payload is most of the doc, so this halves the sink's encoding.
    """
    payload = doc.get("payload", {})
    text = _json(payload)
    if payload is None or "payload" not in doc:
        return text, jcs(doc).decode("utf-8")
    envelope = jcs({**doc, "payload": 0}).decode("utf-8")
    return text, envelope.replace('"payload":0', '"payload":' + text, 1)


def _parsed_payload_and_doc(doc: Mapping[str, Any]) -> tuple[str, str]:
    """:func:`_payload_and_doc` for a doc that :func:`agentlog.schemas.canonical.loads_strict` returned (the sink's)."""
    if isinstance(doc, dict) and doc.get("payload") is not None:
        whole, part = jcs_parsed_and_member(doc, "payload")
        return part.decode("utf-8"), whole.decode("utf-8")
    payload = doc.get("payload", {})
    return ("" if payload is None else jcs_parsed(payload).decode("utf-8")), jcs_parsed(doc).decode("utf-8")


def committed_rows(records: Iterable[CommittedEvent], *, parsed: bool = False) -> Columns:
    """CommittedEvent → ``events``.

    ``parsed=True`` says the records came from :func:`agentlog.schemas.canonical.loads_strict` (the sink
    decodes every one), so ``doc`` and ``payload`` are canonicalised without reading them back
    (:func:`agentlog.schemas.canonical.jcs_parsed`); the text is the same either way.

    Raises:
        LogFormatError: a committed record (``doc``, ``hash``) without ``stateHash`` (log format 1): no row is
            made for it. A record that is not a committed one at all is the caller's ``KeyError``.
    """
    payload_and_doc = _parsed_payload_and_doc if parsed else _payload_and_doc

    def row(rec: CommittedEvent) -> tuple[Any, ...]:
        if "stateHash" not in rec and "doc" in rec and "hash" in rec:  # a committed record, but of format 1
            raise log_format_error(rec)
        doc = rec["doc"]
        src = _source(rec)
        ts_ms = src.get("timestampMs")
        return (
            doc["runId"],
            int(doc["sequence"]),
            doc["eventId"],
            _s(doc.get("causationId")),
            doc["type"],
            _s(doc.get("nodeId")),
            parse_timestamp(doc.get("timestamp"), ts_ms),
            parse_timestamp(ts_ms) if ts_ms is not None else _EPOCH,
            _s(src.get("topic")),
            int(src.get("partition", -1)),
            int(src.get("offset", -1)),
            rec["hash"],
            rec["prevHash"],
            *payload_and_doc(doc),
            _s(rec["stateHash"]),
        )

    return _columnar("events", (row(r) for r in records))


def _error_code(error: Any) -> str:
    if error is None:
        return ""
    if isinstance(error, Mapping):
        return _s(error.get("code") or error.get("errorCode") or error.get("reason"))
    return str(error)


def transition_rows(records: Iterable[Transition]) -> Columns:
    """Transition → ``transitions``."""

    def row(rec: Transition) -> tuple[Any, ...]:
        seq = rec.get("sequence")
        return (
            rec["parentRunId"],
            rec["dispatchId"],
            rec["phase"],
            _s(rec.get("workerId")),
            _s(rec.get("childRunId")),
            _s(rec.get("from")),
            _s(rec.get("to")),
            _s(rec.get("eventId")),
            _s(rec.get("causationId")),
            None if seq is None else int(seq),
            bool(rec.get("derived", False)),
            parse_timestamp(rec.get("timestamp")),
            [str(k) for k in (rec.get("harvestedKeys") or [])],
            _error_code(rec.get("error")),
            _json(rec.get("error")),
            _record_doc(rec),
        )

    return _columnar("transitions", (row(r) for r in records))


def violation_rows(records: Iterable[Violation]) -> Columns:
    """Violation → ``violations``."""

    def row(rec: Violation) -> tuple[Any, ...]:
        return (
            rec["runId"],
            int(rec.get("sequence") or 0),
            _s(rec.get("eventId")),
            rec["code"],
            _s(rec.get("detail")),
            _s(rec.get("workerId")),
            _s(rec.get("phase")),
            _s(rec.get("dispatchId")),
            _record_doc(rec),
        )

    return _columnar("violations", (row(r) for r in records))


def rejection_rows(records: Iterable[Rejection]) -> Columns:
    """Rejection → ``rejections``."""

    def row(rec: Rejection) -> tuple[Any, ...]:
        src = _source(rec)
        seq = rec.get("sequence")
        ts_ms = src.get("timestampMs")
        return (
            _s(src.get("topic")),
            int(src.get("partition", -1)),
            int(src.get("offset", -1)),
            rec["reason"],
            _sealable(rec.get("detail")),
            _s(rec.get("runId")),
            _s(rec.get("eventId")),
            None if seq is None or isinstance(seq, bool) or not isinstance(seq, int) else seq,
            parse_timestamp(ts_ms) if ts_ms is not None else _EPOCH,
            _sealable(rec.get("raw")),
            _record_doc(rec),
        )

    return _columnar("rejections", (row(r) for r in records))


def snapshot_rows(records: Iterable[RunSnapshot]) -> Columns:
    """RunSnapshot → ``snapshots``."""

    def row(rec: RunSnapshot) -> tuple[Any, ...]:
        return (
            rec["runId"],
            int(rec["atSequence"]),
            int(rec.get("logPartition", -1) if rec.get("logPartition") is not None else -1),
            int(rec.get("logOffset", -1) if rec.get("logOffset") is not None else -1),
            _json(rec.get("state")),
            _s(rec.get("stateHash")),
            _s(rec.get("headHash")),
        )

    return _columnar("snapshots", (row(r) for r in records))


def verdict_rows(records: Iterable[Verdict]) -> Columns:
    """Verdict → ``replay_verdicts``; the key includes the verdict's content hash."""

    def row(rec: Verdict) -> tuple[Any, ...]:
        doc = _record_doc(rec)
        compared_through = rec.get("comparedThrough")
        return (
            _s(rec.get("sourceRunId")),
            _s(rec.get("replayRunId")),
            sha256_hex(doc.encode("utf-8")),
            _s(rec.get("mode")),
            _s(rec.get("verdict")),
            _s(rec.get("errorCode")),
            int(compared_through if compared_through is not None else -1),
            _json(rec.get("firstDivergence")),
            _json(rec.get("events") or []),
            doc,
        )

    return _columnar("replay_verdicts", (row(r) for r in records))


def checkpoint_rows(records: Iterable[Checkpoint]) -> Columns:
    """Checkpoint → ``checkpoints``; ``doc`` keeps the exact record, so a signature can be
    re-checked from the table alone."""

    def row(rec: Checkpoint) -> tuple[Any, ...]:
        return (
            rec["runId"],
            int(rec["sequence"]),
            rec["keyId"],
            rec["headHash"],
            rec["stateHash"],
            rec["signature"],
            _record_doc(rec),
        )

    return _columnar("checkpoints", (row(r) for r in records))


#: Record kind (as the sink names them) → table. Aliases cover the topic names too.
TABLE_FOR_KIND: dict[str, str] = {
    "committed": "events",
    "log": "events",
    "event": "events",
    "transition": "transitions",
    "transitions": "transitions",
    "violation": "violations",
    "violations": "violations",
    "rejection": "rejections",
    "rejections": "rejections",
    "snapshot": "snapshots",
    "snapshots": "snapshots",
    "verdict": "replay_verdicts",
    "verdicts": "replay_verdicts",
    "checkpoint": "checkpoints",
    "checkpoints": "checkpoints",
}

ROWS_FOR_TABLE: dict[str, RowMapper] = {
    "events": committed_rows,
    "transitions": transition_rows,
    "violations": violation_rows,
    "rejections": rejection_rows,
    "snapshots": snapshot_rows,
    "replay_verdicts": verdict_rows,
    "checkpoints": checkpoint_rows,
}

ROWS_FOR_KIND: dict[str, RowMapper] = {
    kind: ROWS_FOR_TABLE[table] for kind, table in TABLE_FOR_KIND.items()
}


def rows_for(kind: str, records: Iterable[Mapping[str, Any]], *,
             parsed: bool = False) -> tuple[str, tuple[str, ...], list[list[Any]]]:
    """``(table, column_names, columns)`` for a batch of one record kind.

    ``parsed=True``: the records are what :func:`agentlog.schemas.canonical.loads_strict` returned (see
    :func:`committed_rows`); the rows are the same, computed with less work.

    Raises:
        StoreError: ``unknown_record_kind`` for a kind no table holds, ``bad_record`` when a
            record lacks a field its table needs, or ``log_format_unsupported`` for a log record
            without ``stateHash`` (log format 1).
    """
    table = TABLE_FOR_KIND.get(kind)
    if table is None:
        raise StoreError(
            f"no audit table for record kind {kind!r}; known kinds: {', '.join(sorted(set(TABLE_FOR_KIND)))}",
            code="unknown_record_kind",
        )
    try:
        names, cols = (committed_rows(records, parsed=True) if parsed and table == "events"  # type: ignore[arg-type]
                       else ROWS_FOR_TABLE[table](records))
    except LogFormatError as e:
        raise StoreError(str(e), code=e.code) from e
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"a {kind} record cannot be mapped to table {table}: {e!r}", code="bad_record") from e
    return table, names, cols

