"""The span mapper: OTLP spans (topic ``spans``, keyed by trace id) → RunEventDocs on ``ingest``.

Keyed by **trace**, not by run, because whether an ``invoke_agent`` span starts a child
run depends on its parent span's conversation, and the parent span usually arrives
later (spans are exported when they end). One writer per trace sees all of them; the
run cursors (next sequence, last event id) live in ``otel-runs`` keyed by run id. A
conversation spread over several traces whose ids hash to different partitions would
have two writers; the sequencer then rejects the conflicting sequences
(``sequence_conflict``) — recorded, never silent. With one partition it cannot happen.

Held traces are re-checked on a **tick** record the worker's timer writes every
``otel_tick_s`` to each partition of ``spans`` that holds traces: the clock is the Kafka timestamp of the
records, so the decision is made inside the agent's batch loop (no second writer of
the tables) and a redelivery decides the same way.

The docs go to ``ingest`` like any host's: the sequencer checks sequences, causation
and duplicates (a re-sent span maps to the same event ids).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web

from processors.core.otel import Cursor, Emission, due, is_root, map_trace
from processors.metrics import METRICS
from processors.worker.batch import POSITION_KEY, Batch, SourceRecord, batched_agent
from processors.worker.otlp import Receiver
from processors.worker.wiring import Wiring
from schemas.canonical import jcs
from schemas.records import record_source, rejection
from streams.topics import topic_name

log = logging.getLogger("agentlog.otel")

HELD, RUNS = "otel-held", "otel-runs"
TICK = b'{"tick":1}'
#: Key of the per-partition list of traces with spans still held (NUL: no trace id starts with it).
_PENDING = "\x00pending\x1f"


class _Cursors(Mapping[str, Cursor]):
    """Run cursors as the batch sees them (its own staged writes first)."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch

    def __getitem__(self, run: str) -> Cursor:
        value = self._batch.get(RUNS, run)
        if value is None:
            raise KeyError(run)
        return Cursor(int(value["next"]), value.get("last"))

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _span_key(trace_id: str, span_id: str) -> str:
    return f"{trace_id}\x1f{span_id}"


async def _publish(batch: Batch, partition: int, trace_id: str, entry: dict[str, Any]) -> None:
    pending = {sid: batch.get(HELD, _span_key(trace_id, sid)) for sid in entry["pending"]}
    pending = {sid: span for sid, span in pending.items() if span is not None}
    try:
        emission = map_trace(trace_id, pending, published=entry["published"], cursors=_Cursors(batch))
    except Exception as e:  # noqa: BLE001 - one unmappable trace must not stop the agent; its spans are kept
        log.exception("trace %s could not be mapped; its %d spans go to rejections", trace_id, len(pending))
        emission = Emission()
        for span_id, span in pending.items():
            await batch.send("rejections", None, _span_rejection(span, f"{type(e).__name__}: {e}"))
            emission.published[span_id] = {"run": trace_id, "start": None}
        METRICS.inc("agentlog_otel_unmappable_traces_total")
    for doc in emission.docs:
        await batch.send("ingest", doc["runId"], jcs(doc))
    for run, cursor in emission.cursors.items():
        batch.set(RUNS, partition, run, {"next": cursor.next, "last": cursor.last})
    METRICS.inc("agentlog_otel_spans_published_total", len(pending))
    METRICS.inc("agentlog_otel_events_total", len(emission.docs))
    for sid in pending:
        batch.set(HELD, partition, _span_key(trace_id, sid), None)
    batch.set(HELD, partition, trace_id, {**entry, "pending": [], "published": {**entry["published"],
                                                                              **emission.published}})
    key = f"{_PENDING}{partition}"
    batch.set(HELD, partition, key, [t for t in (batch.get(HELD, key) or []) if t != trace_id])


def _span_rejection(span: dict[str, Any], detail: str) -> bytes:
    raw = jcs(span)
    return jcs(rejection(reason="invalid_payload", detail=f"span could not be mapped: {detail}"[:2000], run_id=None,
                         event_id=None, sequence=None,
                         source=record_source(topic="otel:map", partition=-1, offset=-1, timestamp_ms=0),
                         raw=base64.b64encode(raw[: 256 * 1024]).decode("ascii")))


async def _reject(batch: Batch, rec: SourceRecord, detail: str) -> None:
    source = record_source(topic=rec.topic, partition=rec.partition, offset=rec.offset, timestamp_ms=rec.timestamp_ms)
    await batch.send("rejections", None, jcs(rejection(
        reason="decode_error", detail=detail, run_id=None, event_id=None, sequence=None, source=source,
        raw=base64.b64encode(rec.value[: 256 * 1024]).decode("ascii"))))


def _knobs(batch: Batch) -> dict[str, int]:
    s = batch.wiring.settings
    return {"settle_ms": s.otel_settle_ms, "grace_ms": s.otel_grace_ms, "max_spans": s.otel_max_held_spans}


async def handle(batch: Batch, rec: SourceRecord) -> None:
    """One record of ``spans``: a span to hold (and maybe publish its trace), or a tick."""
    p = rec.partition
    if rec.value == TICK:
        for trace_id in list(batch.get(HELD, f"{_PENDING}{p}") or []):
            entry = batch.get(HELD, trace_id)
            if entry is not None and due(entry, rec.timestamp_ms, **_knobs(batch)):
                await _publish(batch, p, trace_id, entry)
        return
    try:
        span = json.loads(rec.value)
        trace_id, span_id = span["traceId"], span["spanId"]
        int(span["startNs"]), int(span["endNs"])
        if not (isinstance(trace_id, str) and isinstance(span_id, str) and trace_id and span_id):
            raise ValueError("traceId/spanId must be non-empty strings")
    except (ValueError, KeyError, TypeError) as e:
        await _reject(batch, rec, f"not a span record of the spans topic ({type(e).__name__}: {e})"[:500])
        return
    entry = batch.get(HELD, trace_id) or {"pending": [], "published": {}, "firstMs": rec.timestamp_ms,
                                          "lastMs": rec.timestamp_ms, "rootSeen": False}
    if span_id in entry["published"] or batch.get(HELD, _span_key(trace_id, span_id)) is not None:
        METRICS.inc("agentlog_otel_duplicate_spans_total")
        return
    if not entry["pending"]:
        entry = {**entry, "firstMs": rec.timestamp_ms}
        key = f"{_PENDING}{p}"
        batch.set(HELD, p, key, [*(batch.get(HELD, key) or []), trace_id])
    # Each held span is its own table key (one changelog record each): a trace's entry stays small
    # however many spans with captured messages it holds (Kafka caps a record at ~1 MB).
    batch.set(HELD, p, _span_key(trace_id, span_id), span)
    entry = {**entry, "pending": [*entry["pending"], span_id], "lastMs": rec.timestamp_ms,
             "rootSeen": bool(entry["rootSeen"] or is_root(span))}
    batch.set(HELD, p, trace_id, entry)
    if due(entry, rec.timestamp_ms, **_knobs(batch)):
        await _publish(batch, p, trace_id, entry)


def install(wiring: Wiring) -> None:
    """Register the spans topic, the two tables, the mapper agent, its tick timer and the receiver."""
    app, settings = wiring.app, wiring.settings

    wiring.topics["spans"] = app.topic(topic_name(settings, "spans"), key_type=bytes, value_type=bytes,
                                       key_serializer="raw", value_serializer="raw", partitions=settings.partitions)
    for name in (HELD, RUNS):
        wiring.tables[name] = app.Table(name, default=None, partitions=settings.partitions)
    assert not POSITION_KEY.startswith(_PENDING)
    batched_agent(wiring, "spans", name="otel-spans", table=HELD, handle=handle)

    @app.timer(settings.otel_tick_s)  # type: ignore[untyped-decorator]  # faust's App.timer is untyped
    async def otel_tick() -> None:
        # Only partitions holding traces get a tick: an idle worker writes nothing.
        name = wiring.topics["spans"].get_topic_name()
        held = wiring.tables[HELD].data
        for partition in range(settings.partitions):
            if held.get(f"{_PENDING}{partition}"):
                await app.producer.send(name, None, TICK, partition, None, None)

    if settings.otlp_port:
        async def send(trace_id: str, value: bytes) -> Any:
            return await wiring.send("spans", trace_id, value)

        async def reject(value: bytes) -> Any:
            return await wiring.send("rejections", None, value)

        receiver = Receiver(send, reject, ack_timeout_s=settings.otlp_ack_timeout_s,
                            max_body_bytes=settings.otlp_max_body_bytes,
                            max_span_bytes=min(900_000, settings.max_event_bytes))

        @app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
        async def otlp_receiver() -> None:
            runner = web.AppRunner(receiver.app(), access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, "127.0.0.1", settings.otlp_port).start()
            except OSError as e:
                log.error("OTLP receiver cannot listen on 127.0.0.1:%d (%s); set AGENTLOG_OTLP_PORT "
                          "(0 turns it off). The worker keeps running without it.", settings.otlp_port, e)
                await runner.cleanup()
                return
            log.info("OTLP/HTTP receiver on http://127.0.0.1:%d/v1/traces", settings.otlp_port)
            try:
                await asyncio.Event().wait()
            finally:
                await runner.cleanup()
