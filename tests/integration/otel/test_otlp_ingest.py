"""OpenTelemetry ingest end to end: a real instrumented framework, the real OTLP exporter, a real worker.

pydantic-ai (``TestModel``, offline) runs a planner that delegates to a researcher through a tool;
the SDK's ``OTLPSpanExporter`` (HTTP/protobuf) ships the spans to the worker's receiver in
shuffled batches of two, with garbage in between. Everything else is read back through the
``agentlog`` CLI (export, query, sql), and checked against the upstream schema and the spans'
own attributes — nothing here is computed by the mapper under test.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlog.demo.otel import run_planner
from agentlog.schemas.upstream import upstream_file
from tests.integration.worker.worker_proc import WorkerProcess
from tests.tools import agentlog_cli, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _post(port: int, body: bytes, ctype: str = "application/x-protobuf") -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def _wait_for(what: str, probe, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _export(settings, run: str) -> list[dict]:
    out = agentlog_cli(settings, "export", "--run", run)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def test_pydantic_ai_runs_arrive_as_hash_chained_runs_with_a_handoff(settings):
    port = free_port()
    settings = settings.replace(otlp_port=port, web_port=free_port())
    worker = WorkerProcess(settings, sink=True, web=True, log_name="otel-worker", constants={
        "agentlog.worker.spans:SETTLE_MS": 500, "agentlog.worker.spans:TICK_S": 0.2}).start()
    try:
        # Garbage first: a 400 also says the receiver is up.
        _wait_for("the OTLP receiver", lambda: _safe_post(port, b"\x00garbage") == 400)

        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        run_planner(provider)
        spans = list(memory.get_finished_spans())
        random.Random(16).shuffle(spans)
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        for i in range(0, len(spans), 2):
            assert exporter.export(spans[i:i + 2]) == SpanExportResult.SUCCESS
            assert _post(port, b"{not otlp", "application/json") == 400
        exporter.shutdown()

        conv = {s.attributes["gen_ai.agent.name"]: s.attributes["gen_ai.conversation.id"]
                for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_agent"}
        planner_run, child_run = conv["planner"], conv["researcher"]
        planner = _wait_for("the planner run", lambda: (e := _export(settings, planner_run))
                            and e[-1]["type"] == "run.completed" and e)
        child = _wait_for("the child run", lambda: (e := _export(settings, child_run))
                          and e[-1]["type"] == "run.completed" and e)

        for events in (planner, child):
            seen: set[str] = set()
            for i, doc in enumerate(events):
                VALIDATOR.validate(doc)
                assert doc["sequence"] == i
                assert doc.get("causationId") is None or doc["causationId"] in seen
                seen.add(doc["eventId"])
        types = [d["type"] for d in planner]
        chats = sum(1 for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"
                    and s.attributes.get("gen_ai.agent.name") == "planner")
        assert chats == 2
        assert types.count("agent.invocation.started") == chats == types.count("agent.invocation.completed")
        assert types.count("agent.toolCalled") == 1 == types.count("agent.toolReturned")
        assert [d["payload"]["tool"] for d in planner if d["type"] == "agent.toolCalled"] == ["delegate"]
        assert "agent.invocation.completed" in [d["type"] for d in child]

        # The audit history (ClickHouse, via the CLI): the handoff and the tokens.
        def transitions():
            out = agentlog_cli(settings, "sql", "--json",
                       f"SELECT phase, child_run_id FROM transitions WHERE parent_run_id = '{planner_run}'")
            rows = json.loads(out.stdout)["rows"] if out.returncode == 0 else []
            return rows if len(rows) >= 3 else None
        rows = _wait_for("the handoff transitions", transitions)
        assert sorted(r[0] for r in rows) == ["child.completed", "dispatch.began", "dispatch.succeeded"]
        assert {r[1] for r in rows if r[0] != "dispatch.began"} == {child_run}

        expected_in = sum(int(s.attributes.get("gen_ai.usage.input_tokens", 0)) for s in spans)
        expected_out = sum(int(s.attributes.get("gen_ai.usage.output_tokens", 0)) for s in spans)
        assert expected_in > 0

        def usage():
            out = agentlog_cli(settings, "query", "usage", "--json")
            if out.returncode != 0:
                return None
            payload = json.loads(out.stdout)
            rows = [dict(zip(payload["columns"], r, strict=True)) for r in payload["rows"]]
            got = (sum(int(r["input_tokens"]) for r in rows), sum(int(r["output_tokens"]) for r in rows))
            return got if got == (expected_in, expected_out) else None
        _wait_for("usage equal to the spans' tokens", usage)

        # An exporter retry re-sends spans already published: duplicates, never new events.
        again = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=60)
        assert again.export(spans) == SpanExportResult.SUCCESS
        again.shutdown()
        _wait_for("the re-sent spans counted as duplicates",
                  lambda: _metric(settings.web_port, "agentlog_otel_duplicate_spans_total") >= len(spans))
        assert len(_export(settings, planner_run)) == len(planner)
        assert len(_export(settings, child_run)) == len(child)
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()


def _metric(web_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def _safe_post(port: int, body: bytes) -> int | None:
    try:
        return _post(port, body)
    except OSError:
        return None
