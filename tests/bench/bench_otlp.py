"""OTLP spans → committed log, against the same runs sent as JSON to ingest, on the same broker in the same run.

The runs are the OTLP corpus (``tests/otel_corpus``: the exact request bodies OpenAI Agents SDK and
LangGraph programs exported under OpenLLMetry and OpenInference), each copied many times under fresh
trace ids, span ids and conversation ids (``thread_id``, ``group_id``), so every copy is runs of its
own. The copies are packed into requests of at most :data:`SPANS_PER_REQUEST` spans (an SDK
exporter's default batch), protobuf, uncompressed.

- ``ours``: an ``agentlog worker --role process`` subprocess with its OTLP/HTTP receiver on; the
  requests are POSTed by :data:`CLIENTS` concurrent clients, each one request at a time as a
  ``BatchSpanProcessor`` exports (a 503 is retried, as exporters do). Events committed per second.
- ``baseline``: the same runs' RunEventDocs, made by mapping the same requests once, offline, with the
  project's mapping (:func:`agentlog.core.otel.map_trace`, one emission per trace, as the worker
  makes them when a trace arrives whole), published as JSON to ``ingest`` (one idempotent acks=all
  producer, keyed by run) and committed by the same kind of worker.

Both are timed the same way: from the client's first byte (wall clock, this machine) to the broker
timestamp of the last record in the committed log, after a warm-up set of runs has gone through the
same worker (its start and group join are not counted). ``ours`` includes the span mapper's hold: a
trace is published ``SETTLE_MS`` (1 s) after its last span, at the next tick (``TICK_S``, 0.5 s).
Both workers' CPU time between the first byte and the last record is reported per event. The
committed events of ``ours`` are checked to be exactly the offline mapping's (same event ids).

**How many times a span crosses Kafka on its way to the log.** Four topic writes and three consuming
agents (each its own loop of Kafka transactions by default), against two writes and one agent for a host's JSON
event:

1. receiver → ``spans`` (keyed by trace; stream 1, the span mapper): one record per request and trace
   (here a copy's trace arrives in one request, so one record per trace). A span's run depends on its
   parent span's conversation and handoffs, and an exporter sends a span when it *ends*, children
   before parents, in several batches, possibly from several processes: the trace's one writer holds
   its spans (``otel-held``, a changelog record per ``spans`` record and a tombstone when the trace goes
   out) until the trace is due, then plans each run's events in start-time order.
2. span mapper → ``otel-events`` (keyed by run; stream 2, the OTel run sequencer). A run (a
   conversation) usually spans several traces, which land on different ``spans`` partitions: the run's
   one writer gives the events contiguous sequences and backward causation, and remembers event ids
   (``otel-seq``, an entry per sequenced record, its trace's list of records and the run's cursor:
   about three changelog records per record of ~17 events) so a re-sent span adds nothing.
3. run sequencer → ``ingest`` (keyed by run; stream 3, the sequencer), like any host's events: the one
   writer of the log checks sequences, causation and duplicates, hashes the chain and folds the state,
   so OTel runs get the same guarantees and audit path as every other run.
4. sequencer → ``log``.

The old in-process figure (the bare protobuf decode of the same requests vs. decode + the offline
mapping) is kept as a detail. Unit: events/s.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiohttp import ClientSession
from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from agentlog.core.otel import Cursor, map_trace
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from agentlog.worker.otlp import decode_request, span_dicts
from tests.bench import BenchContext
from tests.bench.bench_process import REPO, CpuSampler, _start, _stop, read_with_ts, topic_stamps
from tests.otel_corpus import script as s
from tests.tools import free_port

CORPUS = REPO / "tests" / "otel_corpus"
#: The conversation ids the corpus programs set; each copy gets its own (else every copy is one run).
CONVERSATIONS = (s.GRAPH_THREAD, s.AGENTS_GROUP)
#: An SDK exporter's default ``max_export_batch_size``.
SPANS_PER_REQUEST = 512
#: Concurrent exporter-like clients, one request in flight each.
CLIENTS = 4
WORKER = ["-m", "agentlog", "worker", "--role", "process", "--no-web"]


def _templates() -> list[ExportTraceServiceRequest]:
    """The corpus's OpenAI Agents and LangGraph request bodies, decoded by the receiver's own decoder."""
    paths = sorted(p for program in s.PROGRAMS for instrumentation in s.INSTRUMENTATIONS
                   for p in CORPUS.glob(f"{program}.{instrumentation}*.pb.gz"))
    assert len(paths) == len(s.PROGRAMS) * len(s.INSTRUMENTATIONS), f"the corpus under {CORPUS} is incomplete"
    return [decode_request(p.read_bytes(), "application/x-protobuf", "gzip") for p in paths]


def _retag(values: Iterable[Any], tag: str) -> None:
    """Give every conversation id in these attributes (also inside JSON strings) the copy's tag."""
    for kv in values:
        _retag_value(kv.value, tag)


def _retag_value(v: AnyValue, tag: str) -> None:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        text = v.string_value
        for conv in CONVERSATIONS:
            if conv in text:
                text = text.replace(conv, f"{conv}.{tag}")
        if text != v.string_value:
            v.string_value = text
    elif kind == "array_value":
        for x in v.array_value.values:
            _retag_value(x, tag)
    elif kind == "kvlist_value":
        _retag(v.kvlist_value.values, tag)


def _copy(template: ExportTraceServiceRequest, tag: str) -> ExportTraceServiceRequest:
    """The template's spans under fresh trace and span ids (parents and links follow) and conversation ids."""
    copy = ExportTraceServiceRequest()
    copy.CopyFrom(template)
    traces: dict[bytes, bytes] = {}
    spans: dict[bytes, bytes] = {}

    def fresh(ids: dict[bytes, bytes], old: bytes, n: int) -> bytes:
        return ids.setdefault(old, os.urandom(n)) if old else old

    for rs in copy.resource_spans:
        _retag(rs.resource.attributes, tag)
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.trace_id = fresh(traces, span.trace_id, 16)
                span.span_id = fresh(spans, span.span_id, 8)
                span.parent_span_id = fresh(spans, span.parent_span_id, 8)
                for link in span.links:
                    link.trace_id = fresh(traces, link.trace_id, 16)
                    link.span_id = fresh(spans, link.span_id, 8)
                _retag(span.attributes, tag)
                for event in span.events:
                    _retag(event.attributes, tag)
    return copy


def _spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def requests(sets: int, label: str) -> list[bytes]:
    """``sets`` copies of every corpus request, packed into bodies of at most SPANS_PER_REQUEST spans.

    A copy is never split: its spans arrive in one request, as one program's flush sends them.
    """
    templates = _templates()
    bodies: list[bytes] = []
    batch, size = ExportTraceServiceRequest(), 0
    for i in range(sets):
        for j, template in enumerate(templates):
            copy = _copy(template, f"{label}{i}-{j}")
            n = _spans(copy)
            if size and size + n > SPANS_PER_REQUEST:
                bodies.append(batch.SerializeToString())
                batch, size = ExportTraceServiceRequest(), 0
            batch.resource_spans.extend(copy.resource_spans)
            size += n
    if size:
        bodies.append(batch.SerializeToString())
    return bodies


def map_offline(bodies: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    """The RunEventDocs the worker commits for these requests (each trace whole, in one emission), and the span count."""
    docs: list[dict[str, Any]] = []
    cursors: dict[str, Cursor] = {}
    n_spans = 0
    for body in bodies:
        spans, refused = span_dicts(decode_request(body, "application/x-protobuf"))
        assert not refused, refused
        n_spans += len(spans)
        traces: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for span in spans:
            traces[span["traceId"]][span["spanId"]] = span
        for trace_id, pending in traces.items():
            emission = map_trace(trace_id, pending, published={}, cursors=cursors)
            cursors.update(emission.cursors)
            docs.extend(emission.docs)
    return docs, n_spans


def _bare_decode(bodies: list[bytes]) -> int:
    count = 0
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    count += len(span.attributes) > -1
    return count


async def _post_all(port: int, bodies: list[bytes], clients: int) -> int:
    """POST the bodies from ``clients`` concurrent clients, one request in flight each; the 503s retried."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    retries = 0

    async def client() -> None:
        nonlocal retries
        async with ClientSession() as http:
            while not queue.empty():
                body = queue.get_nowait()
                while True:
                    async with http.post(f"http://127.0.0.1:{port}/v1/traces", data=body,
                                         headers={"Content-Type": "application/x-protobuf"}) as resp:
                        await resp.read()
                        if resp.status == 200:
                            break
                        assert resp.status == 503, resp.status
                    retries += 1
                    await asyncio.sleep(1.0)

    await asyncio.gather(*(client() for _ in range(clients)))
    return retries


async def _publish_json(settings: Settings, docs: list[dict[str, Any]]) -> None:
    """The docs to ingest as a non-SDK host sends them: JSON keyed by runId, acks=all, idempotent."""
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True, linger_ms=5,
                                max_batch_size=1 << 20)
    await producer.start()
    topic = topic_name(settings, "ingest")
    try:
        pending = []
        for doc in docs:
            pending.append(await producer.send(topic, encode_json(doc), key=doc["runId"].encode()))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}; see its log")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"no OTLP receiver on 127.0.0.1:{port} after {timeout}s")


async def _committed_ids(settings: Settings) -> list[str]:
    return [decode_record(value)["doc"]["eventId"] async for _, _, _, value in read_with_ts(settings, "log")]


def _measure(settings: Settings, log: Path, *, warm: Any, measured: Any, warm_events: int, events: int,
             port: int | None = None) -> dict[str, Any]:
    """Start a worker, send ``warm`` and wait for its events, then time ``measured`` from first byte to last record."""
    proc = _start(settings, WORKER, log)
    try:
        if port is not None:
            _wait_listening(port, proc)
        with CpuSampler(proc.pid) as sampler:
            async def go() -> tuple[float, list[int], int]:
                await warm()
                await topic_stamps(settings, "log", warm_events, timeout=300, procs=[proc])
                t0 = time.time()
                retries = await measured()
                stamps = await topic_stamps(settings, "log", warm_events + events, timeout=900, procs=[proc])
                return t0, stamps, retries or 0

            load = os.getloadavg()[0]
            t0, stamps, retries = asyncio.run(go())
        last = stamps[-1] / 1000.0
        wall = max(1e-3, last - t0)
        return {"seconds": wall, "events_per_s": events / wall, "retries_503": retries,
                "load_1m_at_start": load, **sampler.between(t0, last, events)}
    finally:
        _stop(proc)


def run(ctx: BenchContext) -> dict:
    sets = 40 if ctx.quick else 400  # a set: one copy of each corpus request (5 traces, 67 spans, 156 events)
    home = REPO / ".agentlog" / "bench" / f"otlp-{uuid.uuid4().hex[:6]}"
    warm_bodies = requests(2, "warm")
    bodies = requests(sets, "run")
    warm_docs, _ = map_offline(warm_bodies)
    t_map = time.perf_counter()
    docs, n_spans = map_offline(bodies)
    map_s = time.perf_counter() - t_map
    t_decode = time.perf_counter()
    assert _bare_decode(bodies) == n_spans
    decode_s = time.perf_counter() - t_decode
    n = len(docs)
    assert len({d["eventId"] for d in docs}) == n

    port = free_port()
    otlp = ctx.on_own_topics(f"benchotlp{uuid.uuid4().hex[:6]}", home / "otlp", otlp_port=port)
    asyncio.run(ensure_topics(otlp))
    ours = _measure(otlp, home / "ours.log", port=port, warm_events=len(warm_docs), events=n,
                    warm=lambda: _post_all(port, warm_bodies, 1), measured=lambda: _post_all(port, bodies, CLIENTS))
    committed = asyncio.run(_committed_ids(otlp))
    warm_ids = {d["eventId"] for d in warm_docs}
    same = sorted(e for e in committed if e not in warm_ids) == sorted(d["eventId"] for d in docs)
    assert same, f"the worker committed {len(committed) - len(warm_ids)} events, the offline mapping {n}"

    json_settings = ctx.on_own_topics(f"benchotlpjson{uuid.uuid4().hex[:6]}", home / "json")
    asyncio.run(ensure_topics(json_settings))
    baseline = _measure(json_settings, home / "json.log", warm_events=len(warm_docs), events=n,
                        warm=lambda: _publish_json(json_settings, warm_docs),
                        measured=lambda: _publish_json(json_settings, docs))
    return {
        "ours": ours["events_per_s"],
        "baseline": baseline["events_per_s"],
        "unit": "events/s (corpus runs: OTLP vs JSON)",
        "goal_ratio": 0.5,
        "details": {
            "sets": sets, "traces": sets * 5, "spans": n_spans, "events": n, "requests": len(bodies),
            "clients": CLIENTS, "spans_per_request_max": SPANS_PER_REQUEST,
            "ours_spans_per_s": n_spans / ours["seconds"], "ours": ours, "json_baseline": baseline,
            "committed_events_match_offline_mapping": same,
            "in_process": {"bare_decode_spans_per_s": n_spans / decode_s,
                           "decode_and_map_spans_per_s": n_spans / map_s,
                           "note": "one core, no Kafka: the floor an OTLP receiver pays vs the mapping"},
            "kafka_crossings": {"otlp": {"topic_writes": 4, "consuming_agents": 3},
                                "json": {"topic_writes": 2, "consuming_agents": 1}},
        },
    }
