"""OTLP spans → RunEventDocs on ``ingest``, in two stages.

**Stage 1, the span mapper** (topic ``spans``, keyed by trace id): keyed by **trace**,
not by run, because whether an ``invoke_agent`` span starts a child run depends on its
parent span's conversation, and the parent span usually arrives later (spans are
exported when they end). A record holds a request's spans of one trace
(:func:`agentlog.worker.otlp.trace_records`). One writer per trace holds its spans
(``otel-held``: one key per record, the trace's entry listing them), then plans each
run's events in start-time order (:func:`agentlog.core.otel.plan_trace`) and sends
them, **without sequences**, to ``otel-events`` keyed by run: one record per
(published trace, run), so a record's events keep their order.

**Stage 2, the run sequencer** (topic ``otel-events``, keyed by run): one writer per run,
whatever traces its events came from (a conversation usually spans several). It gives
each record's events the run's next sequences and makes causation name earlier events of
the run (:func:`agentlog.core.otel.sequence_run`). Its table ``otel-seq`` holds per run
the cursor ``{"next", "last", "kept"}`` and an index of what it sequenced, one entry per
record: sequence of its first event → ``{"trace", "ids"}``, and per trace the first
sequences of its records. A record's events all come from one trace, and an event
re-emitted (a redelivered record, re-sent spans, late spans of a published trace) comes
from the same trace under the same id, so the record's trace's entries say whether an
event was sequenced already: it is never sequenced again, so a redelivered or re-emitted
record adds nothing. The cursor and the index entries of a batch are committed together
(:mod:`agentlog.worker.txruntime`). The index keeps the last
``RUN_INDEX_MAX`` events of each run (whole records); an event re-emitted after being
forgotten would get a new sequence, which the sequencer rejects as ``duplicate_event_id``
(recorded, never silent), as would an event id a hand-written record repeats under another
trace. Each record is handled on its own from the table state, so a redelivery (whatever
its batch boundaries) sends byte-identical docs.

Held traces are re-checked on a **tick** record the worker's timer writes every
``TICK_S`` to each partition of ``spans`` that holds traces: the clock is the Kafka timestamp of the
records, so the decision is made inside the agent's batch loop (no second writer of
the tables) and a redelivery decides the same way.

Nothing of a host's content is kept outside the two plaintext topics (:mod:`agentlog.core.otel_sealing`).
A held chunk is sealed under the key of its ``spans`` partition and hour (``held/~spans/<p>/<hour>``), which
the mapper mints (it alone reads that partition) and shreds on the first tick that finds nothing of that hour
still held (after the batch that published the last of it is durable, so a redelivery never meets a chunk
whose key is gone): the table's changelog and local files keep only ciphertext, whose key lives about two
hours. Rejections (a record or span the mapper cannot read or map, a refusal the OTLP receiver forwards on
``spans``, an ``otel-events`` record the run sequencer cannot read) have ``raw`` and ``detail`` sealed under
the key :func:`agentlog.core.sequencing.rejection_sealing` names for their partition (and run), minted by the
agent that reads it. Both agents wait for the keyring before their first batch, so a redelivered record is
sealed again under the key it had.

The docs go to ``ingest`` like any host's: the sequencer checks sequences, causation
and duplicates (a re-sent span maps to the same event ids).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from agentlog.core.otel import Cursor, Plan, due, encodable, is_root, plan_trace, sequence_run
from agentlog.core.otel_read import subject
from agentlog.core.otel_sealing import (
    held_bucket,
    held_key_id,
    held_pieces,
    open_held,
    refusal_rejection,
    seal_held,
    shreddable,
)
from agentlog.core.sealing import ERASED, DataKey, seal_value
from agentlog.core.sequencing import RAW_MAX_BYTES, REJECTION_CONTENT, rejection_sealing
from agentlog.metrics import METRICS
from agentlog.schemas.canonical import jcs, sized
from agentlog.schemas.errors import AgentlogError, EventRejected
from agentlog.schemas.records import RecordSource, Rejection, record_source, rejection, run_id_of_key
from agentlog.streams.codec import encode_record
from agentlog.streams.keyring import Keyring
from agentlog.streams.topics import topic_name
from agentlog.worker.otlp import Receiver
from agentlog.worker.ports import NamedTopic, SourceRecord
from agentlog.worker.sequencer import Staging
from agentlog.worker.tables import Table
from agentlog.worker.txruntime import TxAgents
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.otel")
#: The receivers' own logger (agentlog.worker.otlp's).
otlp_log = logging.getLogger("agentlog.otlp")

# When a held trace is published (agentlog.core.otel.due): SETTLE_MS after its last span once its root
# span has arrived, GRACE_MS after its first span at the latest, or at once when MAX_HELD_SPANS are held.
#: 1 s: a trace's child spans exported just after its root still join it; its runs reach the log about
#: 1.5-2.5 s after the root span is exported (README "Sending OpenTelemetry traces").
SETTLE_MS = 1000
#: 30 s: a trace whose root span never comes (a crashed exporter) is published anyway, with what arrived.
GRACE_MS = 30_000
#: Bounds the memory one trace can hold in the worker's table before it is published.
MAX_HELD_SPANS = 10_000
#: How often the worker writes a tick to each partition of ``spans`` holding traces (the clock of due
#: traces): 0.5 s adds at most that to SETTLE_MS.
TICK_S = 0.5
#: Event ids the run sequencer remembers per run, so a re-emitted event is never sequenced twice; the
#: oldest are forgotten beyond this many (one re-sent later is refused as ``duplicate_event_id``).
RUN_INDEX_MAX = 100_000
#: How long a published trace's span ids are remembered, so re-sent spans are dropped: an hour outlasts
#: exporters' retries. 0 = forever.
PUBLISHED_TTL_MS = 3_600_000
#: The OTLP receiver answers 503 with ``Retry-After`` when Kafka has not acknowledged a request's spans
#: within this long, so the exporter retries instead of waiting.
OTLP_ACK_TIMEOUT_S = 10.0
#: A larger OTLP request is refused (413): 16 MiB leaves room for an exporter's default batch of 512 spans
#: carrying long prompts and completions.
OTLP_MAX_BODY_BYTES = 16 * 1024 * 1024

HELD, SEQ = "otel-held", "otel-seq"
#: A record of ``otel-events`` stays below this (Kafka's default cap is ~1 MB); a larger event travels alone.
_RECORD_BYTES = 512 * 1024
TICK = b'{"tick":1}'
#: Key of the per-partition list of traces with spans still held (NUL: no trace id starts with it).
_PENDING = "\x00pending\x1f"
#: Keys of the time buckets of published traces (per partition) and of the oldest bucket not yet expired.
_DONE, _DONE_FROM = "\x00done\x1f", "\x00donefrom\x1f"
#: Key of the per-partition list of hours whose held-spans key may still exist (:func:`_shred`).
_HELD_KEYS = "\x00heldkeys\x1f"


def _chunk_key(trace_id: str, offset: int) -> str:
    """Where the spans a ``spans`` record added to its trace are held (NUL: no span id starts with it); a chunk
    sealed in several pieces keeps the others at ``<chunk key>\x1f<i>``."""
    return f"{trace_id}\x1f\x00{offset}"


def _keyring(batch: Staging) -> Keyring:
    keyring = batch.wiring.keyring
    assert keyring is not None, "the span mapper needs the worker's keyring"
    return keyring


async def _keyring_loaded(batch: Staging) -> None:
    """Wait for the keyring the worker had at start: a redelivered record must be sealed under the key it had."""
    ready = batch.wiring.keyring_ready
    if not ready.is_set():
        await ready.wait()


async def _key(batch: Staging, key_id: str, *, subject_id: str | None = None,
               parent: str | None = None) -> DataKey | None:
    """The data key of keyring entry ``key_id``, minted if it has none (its record goes to the keyring before any
    record of the batch); None once it was erased. Called only by the one agent that reads the partition the id
    names, so two workers never mint one id, and a redelivered record finds the key it was sealed under."""
    keyring = _keyring(batch)
    rec = keyring.record(key_id)
    if rec is None:
        key, rec = keyring.mint(key_id, subject_id, parent)
        await batch.send("keyring", key_id, rec.to_value())
        return key
    return None if rec.erased else keyring.data_key(key_id)


async def _file(batch: Staging, rejected: Rejection, *, subject_id: str | None = None) -> None:
    """Send ``rejected`` to ``rejections`` with ``raw`` and ``detail`` redacted and sealed (a span's bytes, and a
    reason that can quote its attributes), under the key :func:`rejection_sealing` names, whose parent is the
    rejection's run (so erasing the run or its subject reaches it) and whose subject is ``subject_id`` where a span
    names one; both read ``[erased]`` for a run that was erased."""
    sealed_under, place = rejection_sealing(rejected)
    run_id = rejected["runId"]
    key = None
    if run_id is None or not _keyring(batch).erased(run_id):
        key = await _key(batch, sealed_under, subject_id=subject_id if run_id is not None else None, parent=run_id)
    stored = batch.wiring.redactor.rejection(rejected, REJECTION_CONTENT)
    for member in REJECTION_CONTENT:
        stored[member] = ERASED if key is None else seal_value(stored[member], key, sealed_under, place, (member,))
    await batch.send("rejections", run_id, encode_record(stored))


def _held_spans(batch: Staging, trace_id: str, entry: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The trace's held spans (spanId → span, in arrival order) and the table keys holding them.

    An entry is written after its chunks (:func:`handle`), so every pending span is in one; an
    entry holding spans without ``"chunks"`` is not one the span mapper writes, and its spans are
    not found, nor are those of a chunk that does not open (:func:`_publish` logs them).
    """
    found: dict[str, Any] = {}
    keys: list[str] = []
    keyring = _keyring(batch)
    for key in entry.get("chunks", []):
        chunk = batch.get(HELD, key)
        if chunk is None:
            continue
        pieces = [f"{key}\x1f{i}" for i in range(1, held_pieces(chunk))]
        keys += [key, *pieces]
        try:
            spans = open_held([chunk, *(batch.get(HELD, k) for k in pieces)], keyring.key_for, key)
        except (ValueError, AgentlogError) as e:
            log.error("a held chunk of trace %s does not open (%s: %s)", trace_id, type(e).__name__, e)
            continue
        if spans is None:
            log.error("a held chunk of trace %s: its key %s was shredded before the trace went out", trace_id,
                      chunk.get("sealedUnder"))
            continue
        for span in spans:
            found[span["spanId"]] = span
    return {sid: found[sid] for sid in entry["pending"] if sid in found}, keys


async def _publish(batch: Staging, partition: int, trace_id: str, entry: dict[str, Any], now_ms: int,
                   source: RecordSource) -> None:
    """Plan the trace's held spans and send each run's events; ``source``: the record that made it due (the
    position its rejections name)."""
    pending, keys = _held_spans(batch, trace_id, entry)
    if len(pending) < len(entry["pending"]):
        log.error("trace %s: %d of its %d held spans are not in otel-held's chunks (the entry has no \"chunks\" "
                  "naming them, or a chunk did not open); the trace goes out without them", trace_id,
                  len(entry["pending"]) - len(pending), len(entry["pending"]))
    try:
        plan = plan_trace(trace_id, pending, published=entry["published"])
    except Exception as e:  # noqa: BLE001 - one unmappable trace must not stop the agent; its spans are kept
        log.exception("trace %s could not be mapped; its %d spans go to rejections", trace_id, len(pending))
        plan = Plan(trace_id)
        for span_id, span in pending.items():
            await _file(batch, _span_rejection(span, f"{type(e).__name__}: {e}", source))
            plan.published[span_id] = {"run": trace_id, "start": None}
        METRICS.inc("agentlog_otel_unmappable_traces_total")
    for span_id, reason in plan.rejected.items():
        run = plan.published.get(span_id, {}).get("run")  # the run holding the span's opaque event
        span = pending[span_id]
        await _file(batch, _span_rejection(span, reason, source, run), subject_id=subject(span))
    for run, events in plan.runs.items():
        try:
            whole = _json({"run": run, "trace": trace_id, "events": events})
        except EventRejected:  # a doc holds what JSON cannot carry (captured JSON with 2^60 or NaN)
            events = encodable(trace_id, events)
            whole = _json({"run": run, "trace": trace_id, "events": events})
        if len(whole) <= _RECORD_BYTES:  # the usual case, and then _chunks would make this one record too
            await batch.send("otel-events", run, whole)
            continue
        for chunk in _chunks(events):
            await batch.send("otel-events", run, _json({"run": run, "trace": trace_id, "events": chunk}))
    METRICS.inc("agentlog_otel_spans_published_total", len(pending))
    for key in keys:
        batch.set(HELD, partition, key, None)
    batch.set(HELD, partition, trace_id, {**entry, "pending": [], "chunks": [], "publishedMs": now_ms,
                                          "published": {**entry["published"], **plan.published}})
    _remember_published(batch, partition, trace_id, now_ms)
    key = f"{_PENDING}{partition}"
    batch.set(HELD, partition, key, [t for t in (batch.get(HELD, key) or []) if t != trace_id])


def _bucket_ms(ttl_ms: int) -> int:
    """Published traces are remembered in time buckets, about 60 per TTL (at least a second each)."""
    return max(1000, ttl_ms // 60)


def _remember_published(batch: Staging, partition: int, trace_id: str, now_ms: int) -> None:
    ttl = PUBLISHED_TTL_MS
    if ttl <= 0:
        return
    bucket = now_ms // _bucket_ms(ttl)
    key = f"{_DONE}{partition}\x1f{bucket}"
    batch.set(HELD, partition, key, [*(batch.get(HELD, key) or []), trace_id])
    oldest = f"{_DONE_FROM}{partition}"
    if batch.get(HELD, oldest) is None:
        batch.set(HELD, partition, oldest, bucket)


def _expire(batch: Staging, partition: int, now_ms: int) -> None:
    """Forget published traces older than :data:`PUBLISHED_TTL_MS` (by the tick record's Kafka time).

    A forgotten trace whose spans are re-sent is mapped again to the same event ids; the run
    sequencer's index then recognises them (nothing new), as long as it still holds them.
    """
    ttl = PUBLISHED_TTL_MS
    oldest_key = f"{_DONE_FROM}{partition}"
    first = batch.get(HELD, oldest_key)
    if ttl <= 0 or first is None:
        return
    width = _bucket_ms(ttl)
    end = (now_ms - ttl) // width  # buckets below this one hold only traces published > ttl ago
    for bucket in range(int(first), end):
        key = f"{_DONE}{partition}\x1f{bucket}"
        for trace_id in batch.get(HELD, key) or []:
            entry = batch.get(HELD, trace_id)
            # Re-published later (late spans) or holding spans again: a later bucket owns it.
            if entry is not None and not entry["pending"] and int(entry.get("publishedMs") or 0) < (bucket + 1) * width:
                batch.set(HELD, partition, trace_id, None)
                METRICS.inc("agentlog_otel_traces_expired_total")
        if batch.get(HELD, key) is not None:
            batch.set(HELD, partition, key, None)
    if end > int(first):
        remaining = any(batch.get(HELD, f"{_DONE}{partition}\x1f{b}") for b in range(end, now_ms // width + 1))
        batch.set(HELD, partition, oldest_key, end if remaining else None)


def expirable(held: Table, partition: int, ttl_ms: int, now_ms: int) -> bool:
    """Whether a tick would expire something in this partition (the timer asks; the tick decides)."""
    first = held.get(partition, f"{_DONE_FROM}{partition}")
    return ttl_ms > 0 and first is not None and (now_ms - ttl_ms) // _bucket_ms(ttl_ms) > int(first)


#: orjson refuses integers past 2^53 and the types JSON does not have (subclasses, dataclasses, datetimes).
_STRICT = (orjson.OPT_STRICT_INTEGER | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
           | orjson.OPT_PASSTHROUGH_DATETIME)


def _json(obj: Any) -> bytes:
    """An ``otel-events`` record's bytes: the values it is read back as, or :class:`EventRejected`.

    Nothing is hashed from these bytes (the run sequencer writes each doc's JCS), so orjson writes
    them; but orjson writes NaN and the infinities as ``null``, which would change a value, so
    output holding a ``null`` (rare in planned events) is written by :func:`jcs`, which refuses
    them, as it refuses what orjson refuses here.
    """
    try:
        data = orjson.dumps(obj, option=_STRICT)
    except (orjson.JSONEncodeError, TypeError):
        return jcs(obj)
    return jcs(obj) if b"null" in data else sized(data)


def _chunks(events: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Split a run's planned events into records below :data:`_RECORD_BYTES`, in order (deterministic)."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for event in events:
        n = len(_json(event))
        if chunk and size + n > _RECORD_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(event)
        size += n
    if chunk:
        yield chunk


def _rkey(run: str, first: int) -> str:
    """The run's index entry of one sequenced record: ``{"trace", "ids"}``, its event ids from sequence ``first`` on."""
    return f"{run}\x1fr\x1f{first}"


def _tkey(run: str, trace_id: str) -> str:
    """The first sequences of the run's records that came from this trace (where its event ids are)."""
    return f"{run}\x1ft\x1f{trace_id}"


def _cursors(batch: Staging) -> dict[str, tuple[int, dict[str, Any]]]:
    """The run cursors this batch moved (run → partition, cursor), written by :func:`_write_cursors`."""
    if not batch.collected:
        batch.collected.append({})
    cursors: dict[str, tuple[int, dict[str, Any]]] = batch.collected[0]
    return cursors


async def _write_cursors(batch: Staging) -> None:
    """Write the batch's run cursors after every index entry of the batch (the order :func:`_repair` relies on)."""
    for run, (p, cursor) in _cursors(batch).items():
        batch.set(SEQ, p, run, cursor)


def _forget(batch: Staging, p: int, run: str, kept: int, nxt: int) -> int:
    """Drop the run's oldest index entries until at most :data:`RUN_INDEX_MAX` events are indexed; the new ``kept``."""
    limit = max(1, RUN_INDEX_MAX)
    while nxt - kept > limit:
        if (entry := batch.get(SEQ, _rkey(run, kept))) is not None:
            batch.set(SEQ, p, _rkey(run, kept), None)
            tkey = _tkey(run, entry["trace"])
            firsts = [f for f in batch.get(SEQ, tkey) or [] if f != kept]
            batch.set(SEQ, p, tkey, firsts or None)
            kept += max(1, len(entry["ids"]))
            continue
        kept += 1  # no record starts here (not an index the sequencer writes): step over the sequence
    return kept


async def sequence(batch: Staging, rec: SourceRecord) -> None:
    """One record of ``otel-events``: give its events the run's next sequences and send them to ``ingest``."""
    await _keyring_loaded(batch)
    try:
        msg = orjson.loads(rec.value)  # a ValueError, as json.loads's, for what is not JSON
        run, trace_id, events = msg["run"], msg["trace"], msg["events"]
        if not (isinstance(run, str) and run and isinstance(trace_id, str) and isinstance(events, list)):
            raise ValueError("run/trace must be strings and events a list")
        for event in events:
            if not (isinstance(event, dict) and isinstance(event.get("doc"), dict)
                    and isinstance(event["doc"].get("eventId"), str) and event["doc"].get("runId") == run):
                raise ValueError("each event must be {doc: RunEventDoc of this run, span}")
    except (ValueError, KeyError, TypeError) as e:
        await _reject(batch, rec, f"not a record of the otel-events topic ({type(e).__name__}: {e})"[:500],
                      run_id=run_id_of_key(rec.key))
        return
    p = rec.partition
    cursors = _cursors(batch)
    moved = cursors.get(run)
    head = moved[1] if moved is not None else batch.get(SEQ, run) or {"next": 0, "last": None, "kept": 0}
    cursor = Cursor(int(head["next"]), head.get("last"))
    tkey = _tkey(run, trace_id)
    firsts = batch.get(SEQ, tkey) or []
    known: set[str] = set()
    for first in firsts:
        if (entry := batch.get(SEQ, _rkey(run, first))) is not None:
            known.update(entry["ids"])
    done = sequence_run(cursor, lambda eid: eid in known, trace_id, events, parsed=True)
    for data in done.data:
        await batch.send("ingest", run, data)
    if done.docs:
        # One index entry per record (a record's events come from one trace, and a re-emitted event has
        # the id it had, from the same trace): the trace's list names it, the entry lists its ids.
        first = int(done.docs[0]["sequence"])
        batch.set(SEQ, p, tkey, [*firsts, first])
        batch.set(SEQ, p, _rkey(run, first), {"trace": trace_id, "ids": [doc["eventId"] for doc in done.docs]})
    kept = _forget(batch, p, run, int(head.get("kept") or 0), done.cursor.next)
    if done.docs or kept != int(head.get("kept") or 0) or (cursor.next, cursor.last) != (head["next"], head["last"]):
        cursors[run] = (p, {"next": done.cursor.next, "last": done.cursor.last, "kept": kept})
    METRICS.inc("agentlog_otel_events_total", len(done.docs))
    if done.duplicates:
        METRICS.inc("agentlog_otel_duplicate_events_total", done.duplicates)


def _source(rec: SourceRecord) -> RecordSource:
    return record_source(topic=rec.topic, partition=rec.partition, offset=rec.offset, timestamp_ms=rec.timestamp_ms)


def _span_rejection(span: dict[str, Any], detail: str, source: RecordSource, run_id: str | None = None) -> Rejection:
    """A span the mapper refused, at the position of the record that published its trace; ``run_id``: the run its
    place went to, None where no run was derived."""
    raw = jcs(span)
    return rejection(reason="invalid_payload", detail=f"span could not be mapped: {detail}"[:2000], run_id=run_id,
                     event_id=None, sequence=None, source=source,
                     raw=base64.b64encode(raw[:RAW_MAX_BYTES]).decode("ascii"))


async def _reject(batch: Staging, rec: SourceRecord, detail: str, raw: bytes | None = None, *,
                  run_id: str | None = None) -> None:
    """Record ``rec`` (or ``raw``, a part of it) on the rejections topic with ``detail``, under ``run_id``.

    An ``otel-events`` record is keyed by its run, so its rejection keeps that run id; a ``spans``
    record is keyed by its trace, and which runs a trace's spans belong to is decided only once
    they are mapped, so its rejection has none.
    """
    await _file(batch, rejection(
        reason="decode_error", detail=detail, run_id=run_id, event_id=None, sequence=None, source=_source(rec),
        raw=base64.b64encode((rec.value if raw is None else raw)[:RAW_MAX_BYTES]).decode("ascii")))


def _knobs(batch: Staging) -> dict[str, int]:
    return {"settle_ms": SETTLE_MS, "grace_ms": GRACE_MS, "max_spans": MAX_HELD_SPANS}


async def handle(batch: Staging, rec: SourceRecord) -> None:
    """One record of ``spans``: a trace's spans to hold (and maybe publish the trace), a refusal the
    receiver forwards, or a tick."""
    await _keyring_loaded(batch)
    p = rec.partition
    if rec.value == TICK:
        ready = []
        for trace_id in list(batch.get(HELD, f"{_PENDING}{p}") or []):
            entry = batch.get(HELD, trace_id)
            if entry is not None and due(entry, rec.timestamp_ms, **_knobs(batch)):
                ready.append((int(entry.get("startNs", 0)), trace_id, entry))
        # Traces due at the same tick go out earliest span first: a conversation's turns (several
        # traces) reach its run sequencer in the order they started, as far as the holds allow.
        for _, trace_id, entry in sorted(ready, key=lambda r: (r[0], r[1])):
            await _publish(batch, p, trace_id, entry, rec.timestamp_ms, _source(rec))
        _expire(batch, p, rec.timestamp_ms)
        _shred(batch, p, rec.timestamp_ms)  # after the publishing: what is due is out
        return
    try:
        msg = orjson.loads(rec.value)  # a ValueError, as json.loads's, for what is not JSON
        if isinstance(msg, dict) and "refused" in msg:
            try:
                refused = refusal_rejection(msg, _source(rec))
            except ValueError as e:
                await _reject(batch, rec, f"not a refusal record of the spans topic ({e})"[:500])
                return
            await _file(batch, refused)
            return
        trace_id, spans, bad = _read_spans(msg)
    except (ValueError, KeyError, TypeError) as e:
        await _reject(batch, rec, f"not a span record of the spans topic ({type(e).__name__}: {e})"[:500])
        return
    for raw, why in bad:
        await _reject(batch, rec, f"not a span of the spans topic ({why})"[:500], raw=raw)
    entry = batch.get(HELD, trace_id) or {"pending": [], "published": {}, "firstMs": rec.timestamp_ms,
                                          "lastMs": rec.timestamp_ms, "rootSeen": False}
    held = set(entry["pending"])
    fresh: list[dict[str, Any]] = []
    for span in spans:
        if span["spanId"] in entry["published"] or span["spanId"] in held:
            METRICS.inc("agentlog_otel_duplicate_spans_total")
            continue
        held.add(span["spanId"])
        fresh.append(span)
    if not fresh:
        return
    start = min(int(span["startNs"]) for span in fresh)
    if not entry["pending"]:
        entry = {**entry, "firstMs": rec.timestamp_ms, "chunks": [], "startNs": str(start)}
        key = f"{_PENDING}{p}"
        batch.set(HELD, p, key, [*(batch.get(HELD, key) or []), trace_id])
    # The record's new spans are one table key (one changelog record, one tombstone when the trace
    # goes out), apart from the trace's entry: the entry stays small however many spans with captured
    # messages the trace holds. They are sealed under the key of this partition's hour (a long token in
    # pieces, each a changelog record below Kafka's record limit).
    chunk = _chunk_key(trace_id, rec.offset)
    bucket = held_bucket(int(entry["firstMs"]), rec.timestamp_ms)
    sealed_under = held_key_id(p, bucket)
    data_key = None if _shredding(batch, sealed_under) else await _key(batch, sealed_under)
    if data_key is None:
        # The hour's key is gone, or goes once this batch is durable: by the ticks' clock the trace's first spans
        # came over GRACE_MS ago (a producer's clock behind), so the trace is overdue. It goes out now, and this
        # plaintext chunk, deleted again in this batch, is never written.
        batch.set(HELD, p, chunk, fresh)
    else:
        head, *pieces = seal_held(fresh, data_key, sealed_under, chunk)
        batch.set(HELD, p, chunk, head)
        for i, piece in enumerate(pieces, 1):
            batch.set(HELD, p, f"{chunk}\x1f{i}", piece)
        _note_held_key(batch, p, bucket)
    entry = {**entry, "pending": [*entry["pending"], *(span["spanId"] for span in fresh)],
             "chunks": [*entry.get("chunks", []), chunk], "lastMs": rec.timestamp_ms,
             "rootSeen": bool(entry["rootSeen"] or any(is_root(span) for span in fresh)),
             "startNs": str(min(start, int(entry.get("startNs", start))))}
    batch.set(HELD, p, trace_id, entry)
    if data_key is None or due(entry, rec.timestamp_ms, **_knobs(batch)):
        await _publish(batch, p, trace_id, entry, rec.timestamp_ms, _source(rec))


def _note_held_key(batch: Staging, partition: int, bucket: int) -> None:
    """Remember that hour ``bucket``'s key seals something, so that a tick shreds it (:func:`_shred`)."""
    key = f"{_HELD_KEYS}{partition}"
    live = batch.get(HELD, key) or []
    if bucket not in live:
        batch.set(HELD, partition, key, sorted([*live, bucket]))


def _shredding(batch: Staging, key_id: str) -> bool:
    """Whether this batch shreds ``key_id`` once it is durable (a tick before in the batch named it)."""
    return any(item[0] == "shred" and item[1] == key_id for item in batch.collected)


def _shred(batch: Staging, partition: int, now_ms: int) -> None:
    """At a tick: name the hours whose held-spans key can go (:func:`agentlog.core.otel_sealing.shreddable`), for
    :func:`_shred_keys` once the batch is durable, and forget those whose key is gone.

    The key goes after the batch, not with it: the keyring's records are acknowledged before the batch's others,
    and a crash in between would redeliver the tick to chunks whose key is gone. An hour stays listed until the
    keyring shows its key erased, so a shred a crash interrupted is done again at a later tick.
    """
    key = f"{_HELD_KEYS}{partition}"
    live = batch.get(HELD, key) or []
    keyring = _keyring(batch)
    keep = []
    for bucket in live:
        key_id = held_key_id(partition, bucket)
        if shreddable(bucket, now_ms, grace_ms=GRACE_MS):
            rec = keyring.record(key_id)
            if rec is None:
                log.warning("held-spans key %s is not in this worker's keyring; it is not shredded here", key_id)
                continue
            if rec.erased:
                continue
            batch.collected.append(("shred", key_id, now_ms))
        keep.append(bucket)
    if keep != live:
        batch.set(HELD, partition, key, keep or None)


async def _shred_keys(batch: Staging) -> None:
    """Erase the held-spans keys a tick of this batch named (the batch is durable: every trace held under them is
    out), as an erase does: the marker over the key's record, which the keyring's compaction then removes."""
    keyring = _keyring(batch)
    for item in batch.collected:
        if item[0] != "shred":
            continue
        _, key_id, at_ms = item
        rec = keyring.record(key_id)
        if rec is None or rec.erased:
            continue
        marker = rec.erase(at_ms)
        await (await batch.wiring.send("keyring", key_id, marker.to_value()))
        keyring.put(marker)
        METRICS.inc("agentlog_otel_held_keys_shredded_total")


def shred_due(held: Table, partition: int, now_ms: int) -> bool:
    """Whether a tick would shred a held-spans key of this partition (the timer asks; the tick decides)."""
    live = held.get(partition, f"{_HELD_KEYS}{partition}")
    return bool(live) and shreddable(min(live), now_ms, grace_ms=GRACE_MS)


def _read_spans(msg: Any) -> tuple[str, list[dict[str, Any]], list[tuple[bytes, str]]]:
    """A ``spans`` record's trace id, its readable spans and ``(bytes, reason)`` of the others.

    A record is ``{"traceId", "spans": [span, ...]}`` (:func:`agentlog.worker.otlp.trace_records`), ``msg``
    its parsed JSON. Raises ValueError, KeyError or TypeError for a record that is not.
    """
    if not (isinstance(msg, dict) and isinstance(msg.get("spans"), list)):
        raise ValueError('a spans record is {"traceId", "spans": [span, ...]}')
    trace_id = msg["traceId"]
    if not (isinstance(trace_id, str) and trace_id):
        raise ValueError("traceId must be a non-empty string")
    good: list[dict[str, Any]] = []
    bad: list[tuple[bytes, str]] = []
    for span in msg["spans"]:
        try:
            if not (isinstance(span, dict) and span.get("traceId") == trace_id):
                raise ValueError("a span of another trace")
            span_id = span["spanId"]
            int(span["startNs"]), int(span["endNs"])
            if not (isinstance(span_id, str) and span_id):
                raise ValueError("spanId must be a non-empty string")
        except (ValueError, KeyError, TypeError) as e:
            bad.append((orjson.dumps(span), f"{type(e).__name__}: {e}"))
            continue
        good.append(span)
    return trace_id, good, bad


async def serve_otlp(receiver: Receiver, host: str, port: int) -> None:
    """Serve OTLP/HTTP on ``host:port`` and OTLP/gRPC on ``host:(port - 1)`` until cancelled.

    Either one that cannot listen (the port taken, no ``grpcio`` for gRPC) is logged once and left
    off; the worker keeps running.
    """
    runner = web.AppRunner(receiver.app(), access_log=None)
    await runner.setup()
    grpc_server: Any = None
    try:
        try:
            await web.TCPSite(runner, host, port).start()
            otlp_log.info("OTLP/HTTP receiver on http://%s:%d/v1/traces", host, port)
        except OSError as e:
            otlp_log.error("OTLP/HTTP receiver cannot listen on %s:%d (%s); set AGENTLOG_OTLP_PORT (0 turns it "
                      "off). The worker keeps running without it.", host, port, e)
        grpc_server = await _start_grpc(receiver, host, port)
        await asyncio.Event().wait()
    finally:
        if grpc_server is not None:
            await grpc_server.stop(1.0)
        await runner.cleanup()


async def _start_grpc(receiver: Receiver, host: str, http_port: int) -> Any:
    try:
        from agentlog.worker import otlp_grpc
    except ImportError as e:  # grpcio is the optional `grpc` extra
        otlp_log.warning("OTLP/gRPC is off: %s (pip install 'agentlog[grpc]'); OTLP/HTTP is on", e)
        return None
    port = otlp_grpc.grpc_port(http_port)
    if not port:
        otlp_log.warning("OTLP/gRPC is off: AGENTLOG_OTLP_PORT=%d leaves no port below it", http_port)
        return None
    try:
        server = await otlp_grpc.start(receiver, host, port)
    except OSError as e:
        otlp_log.error("OTLP/gRPC receiver cannot listen on %s:%d (%s); it serves on AGENTLOG_OTLP_PORT - 1. "
                  "The worker keeps running without it.", host, port, e)
        return None
    otlp_log.info("OTLP/gRPC receiver on %s:%d", host, port)
    return server


def install(wiring: Wiring, agents: TxAgents) -> None:
    """Register the two topics and tables, the mapper and run-sequencer agents, the tick timer and the receivers."""
    runner, settings = wiring.runner, wiring.settings

    wiring.topics["spans"] = NamedTopic(topic_name(settings, "spans"))
    wiring.topics["otel-events"] = NamedTopic(topic_name(settings, "otel-events"))
    for name in (HELD, SEQ):
        agents.table(name)
    owned = agents.agent("spans", name="otel-spans", table=HELD, handle=handle, after_commit=_shred_keys)
    agents.agent("otel-events", name="otel-sequencer", table=SEQ, handle=sequence, before_commit=_write_cursors)

    async def otel_tick() -> None:
        # Only partitions holding traces (or published traces due to be forgotten, or a held-spans key due to
        # be shredded) get a tick: an idle worker writes nothing.
        name = wiring.topics["spans"].get_topic_name()
        held = wiring.tables[HELD]
        now_ms = int(time.time() * 1000)
        for partition in owned.partitions(name):
            if (held.get(partition, f"{_PENDING}{partition}") or expirable(held, partition, PUBLISHED_TTL_MS, now_ms)
                    or shred_due(held, partition, now_ms)):
                await wiring.producer.send(name, None, TICK, partition)

    runner.timer(TICK_S, otel_tick)

    if settings.otlp_port:
        async def send(trace_id: str, value: bytes) -> Any:
            return await wiring.send("spans", trace_id, value)

        async def refuse(trace_id: str | None, value: bytes) -> Any:
            # A refusal goes to the span mapper of its trace's partition, which files it sealed: the receiver,
            # on every worker, is the one writer of no keyring entry.
            return await wiring.send("spans", trace_id, value)

        receiver = Receiver(send, refuse, ack_timeout_s=OTLP_ACK_TIMEOUT_S, max_body_bytes=OTLP_MAX_BODY_BYTES,
                            max_span_bytes=min(900_000, settings.max_event_bytes), token=settings.web_token)

        async def otlp_receiver() -> None:
            # The worker's HTTP endpoints share one interface (web_host) and one token rule.
            await serve_otlp(receiver, settings.web_host, settings.otlp_port)

        runner.task(otlp_receiver)
