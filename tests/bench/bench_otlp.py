"""OTLP ingest: receiver + mapping, vs a bare OTLP decode of the same requests.

``ours``: the worker's ``/v1/traces`` handler (:class:`processors.worker.otlp.Receiver`, real
aiohttp server) publishing every span to a real ``spans`` topic with acks=all and answering
only after the acks, then the spans read back from Kafka and mapped to RunEventDocs
(:func:`processors.core.otel.map_trace`, one call per trace — the span mapper's data path; the
Faust batch loop around it is left out, as in ``bench_sink``). ``baseline``: parsing the very
same request bodies with ``opentelemetry-proto`` and touching every span — the floor any
OTLP receiver pays. Spans come from a real pydantic-ai run (planner → researcher), copied
under fresh trace ids. Unit: spans/s.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from aiohttp import ClientSession, web
from aiokafka import AIOKafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from processors.core.otel import map_trace
from processors.demo.otel import run_planner
from processors.worker.otlp import Receiver
from streams.admin import ensure_topics
from streams.reader import read_topic
from streams.security import client_kwargs
from streams.settings import Settings
from streams.topics import topic_name
from tests.bench import BenchContext, own
from tests.tools import free_port

TRACES_PER_REQUEST = 10


def _requests(n_traces: int) -> list[bytes]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    run_planner(provider)
    template = encode_spans(memory.get_finished_spans())
    bodies = []
    for start in range(0, n_traces, TRACES_PER_REQUEST):
        request = ExportTraceServiceRequest()
        for _ in range(start, min(n_traces, start + TRACES_PER_REQUEST)):
            copy = ExportTraceServiceRequest()
            copy.CopyFrom(template)
            trace_id = os.urandom(16)
            for rs in copy.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        span.trace_id = trace_id
            request.resource_spans.extend(copy.resource_spans)
        bodies.append(request.SerializeToString())
    return bodies


async def _ours(settings: Settings, bodies: list[bytes], n_spans: int, phases: dict[str, float]) -> float:
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True,
                                linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    spans_topic = topic_name(settings, "spans")

    async def send(trace_id: str, value: bytes):
        return await producer.send(spans_topic, value, key=trace_id.encode())

    async def reject(value: bytes):
        return await producer.send(topic_name(settings, "rejections"), value)

    receiver = Receiver(send, reject, ack_timeout_s=60, max_body_bytes=64 << 20)
    runner = web.AppRunner(receiver.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        t0 = time.perf_counter()
        async with ClientSession() as http:
            for body in bodies:  # one exporter: requests one after another, as BatchSpanProcessor sends them
                async with http.post(f"http://127.0.0.1:{port}/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"}) as resp:
                    assert resp.status == 200, resp.status
        phases["receive_s"] = time.perf_counter() - t0
        traces: dict[str, dict[str, dict]] = {}
        read = 0
        async for _p, _o, _k, span in read_topic(settings, "spans"):
            traces.setdefault(span["traceId"], {})[span["spanId"]] = span
            read += 1
        phases["read_back_s"] = time.perf_counter() - t0 - phases["receive_s"]
        t_map = time.perf_counter()
        docs = sum(len(map_trace(t, spans, published={}, cursors={}).docs) for t, spans in traces.items())
        phases["map_s"] = time.perf_counter() - t_map
        elapsed = time.perf_counter() - t0
        assert read == n_spans and docs > n_spans, (read, docs)
        return n_spans / elapsed
    finally:
        await runner.cleanup()
        await producer.stop()


def _baseline(bodies: list[bytes]) -> tuple[float, int]:
    t0 = time.perf_counter()
    count = 0
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    count += len(span.attributes) > -1
    return count / (time.perf_counter() - t0), count


def run(ctx: BenchContext) -> dict:
    n_traces = 200 if ctx.quick else 2000
    settings = ctx.settings.replace(topic_prefix=own(f"benchotlp{uuid.uuid4().hex[:6]}"), partitions=4,
                                    replication_factor=1)
    asyncio.run(ensure_topics(settings))
    bodies = _requests(n_traces)
    baseline, n_spans = _baseline(bodies)
    phases: dict[str, float] = {}
    ours = asyncio.run(_ours(settings, bodies, n_spans, phases))
    return {
        "ours": ours,
        "baseline": baseline,
        "unit": "spans/s",
        "goal_ratio": None,  # the figure is what is asked for, not a target
        "details": {"traces": n_traces, "spans": n_spans, "requests": len(bodies),
                    "phases_s": {k: round(v, 3) for k, v in phases.items()},
                    "note": "ours = HTTP + Kafka acks=all + read back + map; baseline = protobuf decode only"},
    }
