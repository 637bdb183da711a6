"""One conversation over two traces, end to end: the run-keyed stage makes it one whole run.

The real OpenTelemetry SDK records two turns of one ``gen_ai.conversation.id`` (two traces,
whose ids the SDK's own ``IdGenerator`` hook picks so they land on **different** partitions of
``spans``: the run's events come from two partitions of the span mapper). The
spans go to the worker's receiver through the real ``OTLPSpanExporter`` in separate small
requests, shuffled and interleaved across the traces. The run is read back with
``agentlog export`` and checked against the upstream schema; a re-send must add nothing.
"""

from __future__ import annotations

import json
import random
import urllib.request
import uuid

import pytest
from aiokafka.partitioner import DefaultPartitioner
from jsonschema import Draft202012Validator
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from agentlog.schemas.upstream import upstream_file
from tests.integration.otel.test_otlp_ingest import _export, _metric, _safe_post, _wait_for
from tests.integration.worker.test_metrics_scrape import parse_exposition, readme_series
from tests.integration.worker.worker_proc import WorkerProcess
from tests.tools import free_port
from tests.unit.core.test_otel_runs import conversation_spans

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
PARTITIONS = 2
#: The span mapper's timing, quicker: a trace is due 0.5 s after its last span, checked every 0.2 s.
QUICK = {"agentlog.worker.spans:SETTLE_MS": 500, "agentlog.worker.spans:TICK_S": 0.2}


class _SpreadTraces(RandomIdGenerator):
    """Random ids, but each new trace id hashes to a ``spans`` partition no earlier trace used."""

    def __init__(self, partitions: int) -> None:
        self._all = list(range(partitions))
        self._used: set[int] = set()
        self._rng = random.Random(1616)

    def generate_trace_id(self) -> int:
        while True:
            trace_id = self._rng.getrandbits(128)
            partition = DefaultPartitioner()(f"{trace_id:032x}".encode(), self._all, self._all)
            if partition not in self._used:
                self._used.add(partition)
                return trace_id


def test_a_conversation_over_two_traces_on_two_partitions_is_one_contiguous_run(settings):
    port = free_port()
    settings = settings.replace(partitions=PARTITIONS, otlp_port=port, web_port=free_port())
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(settings, sink=False, web=True, log_name="otel-conv-worker", constants=QUICK).start()
    try:
        _wait_for("the OTLP receiver", lambda: _safe_post(port, b"\x00garbage") == 400)
        memory = InMemorySpanExporter()
        provider = TracerProvider(id_generator=_SpreadTraces(PARTITIONS))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        conversation_spans(provider, conversation)
        spans = list(memory.get_finished_spans())
        assert len({s.context.trace_id for s in spans}) == 2
        random.Random(16).shuffle(spans)  # both traces' spans interleaved
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        for i in range(0, len(spans), 2):
            assert exporter.export(spans[i:i + 2]) == SpanExportResult.SUCCESS
        exporter.shutdown()

        # Per turn: run.started/completed, 2 chats × (started, completed, usage), tool called/returned.
        expected = 2 * (2 + 2 * 3 + 2)
        events = _wait_for("the whole conversation run",
                           lambda: (e := _export(settings, conversation)) and len(e) >= expected and e)
        assert len(events) == expected
        seen: set[str] = set()
        for i, doc in enumerate(events):
            VALIDATOR.validate(doc)
            assert doc["sequence"] == i
            assert doc.get("causationId") is None or doc["causationId"] in seen
            seen.add(doc["eventId"])
        types = [d["type"] for d in events]
        assert types.count("run.started") == 2 == types.count("run.completed")
        assert sorted(d["payload"]["inputTokens"] for d in events if d["type"] == "provider.usage") == [
            10, 11, 20, 20]

        # A re-send (an exporter retry of everything) adds nothing.
        again = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        assert again.export(spans) == SpanExportResult.SUCCESS
        again.shutdown()
        _wait_for("the re-sent spans counted as duplicates",
                  lambda: _metric(settings.web_port, "agentlog_otel_duplicate_spans_total") >= len(spans))
        assert [d["eventId"] for d in _export(settings, conversation)] == [d["eventId"] for d in events]

        # The README's OpenTelemetry metrics are exposed with their documented labels and, where this
        # scenario drives them, counted (the metrics scrape test leaves them to this one).
        types, samples = parse_exposition(_scrape(settings.web_port))
        documented = {n: labels for n, labels in readme_series().items() if n.startswith(("agentlog_otel_",
                                                                                          "agentlog_otlp_"))}
        assert len(documented) == 8
        assert all(types.get(name) == "counter" for name in documented), types
        not_driven = {"agentlog_otel_unmappable_traces_total", "agentlog_otel_duplicate_events_total",
                      "agentlog_otel_traces_expired_total"}  # the latter two: see the expiry test below
        assert sorted(n for n in set(documented) - not_driven if not samples.get(n)) == []
        assert all(set(labels) == documented[n] for n in documented for labels, _ in samples.get(n, []))
        assert sum(v for _, v in samples["agentlog_otel_events_total"]) == expected
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()


def _scrape(web_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=30) as resp:
        return resp.read().decode()


def test_forgotten_traces_re_sent_are_recognised_by_the_run_sequencer(settings):
    port = free_port()
    settings = settings.replace(otlp_port=port, web_port=free_port())
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(settings, sink=False, web=True, log_name="otel-ttl-worker",
                           constants={**QUICK, "agentlog.worker.spans:PUBLISHED_TTL_MS": 2000}).start()
    try:
        _wait_for("the OTLP receiver", lambda: _safe_post(port, b"\x00garbage") == 400)
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        conversation_spans(provider, conversation)
        spans = list(memory.get_finished_spans())
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        expected = 2 * (2 + 2 * 3 + 2)
        events = _wait_for("the conversation run",
                           lambda: (e := _export(settings, conversation)) and len(e) >= expected and e)
        assert len(events) == expected
        # Both traces are forgotten by the span mapper after the TTL...
        _wait_for("both published traces expired",
                  lambda: _metric(settings.web_port, "agentlog_otel_traces_expired_total") >= 2)
        # ...so a re-send is mapped again, and the run sequencer's index recognises every event.
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        exporter.shutdown()
        _wait_for("the re-mapped events recognised as already sequenced",
                  lambda: _metric(settings.web_port, "agentlog_otel_duplicate_events_total") >= expected)
        assert _metric(settings.web_port, "agentlog_otel_duplicate_spans_total") == 0
        assert [d["eventId"] for d in _export(settings, conversation)] == [d["eventId"] for d in events]
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()
