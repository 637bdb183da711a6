"""Scrape a real worker: every metric series the README documents is in ``/metrics``; ``/health`` is ok.

The list of series is parsed from the README's "## Metrics" section (backticked
``name{label,...}``), so the documentation and the exposition cannot drift apart silently. The
worker runs with its web server and the audit sink on; the test publishes good events (a check-mode
multi-agent run and a host replay), a legal-but-illegal handoff event, a duplicate eventId and a value
with a bad magic byte, then checks the counts it knows exactly and the label names of every sample.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from agentlog import metrics
from agentlog.schemas.canonical import jcs
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import free_port
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

README = Path(__file__).resolve().parents[3] / "README.md"

#: README series this scenario cannot drive without a crash or a failing ClickHouse: they must be
#: declared (``# TYPE``), and any sample they have must carry the documented labels.
NOT_DRIVEN = {
    "agentlog_redelivered_total": "needs a worker restart mid-batch",
    "agentlog_sink_errors_total": "needs a failing ClickHouse insert",
    "agentlog_sink_unproven_total": "needs a log record from a foreign writer: counted in tests/unit/audit/test_sink_raw.py",
    "agentlog_worker_child_restarts_total": "needs --sink-process and a child's death: driven in test_halves.py",
    "agentlog_batches_fenced_total": "needs a zombie's batch refused: driven in test_tx_zombie.py",
    "agentlog_run_closes_asked_total": "needs a run past its grace: driven in test_run_lifetimes.py",
    "agentlog_runs_closed_total": "needs a run past its grace: driven in test_run_lifetimes.py",
    **{name: "needs OTLP traffic: sampled in tests/integration/otel/test_otel_conversation.py" for name in (
        "agentlog_otlp_requests_total", "agentlog_otlp_spans_total", "agentlog_otel_spans_published_total",
        "agentlog_otel_duplicate_spans_total", "agentlog_otel_unmappable_traces_total", "agentlog_otel_events_total",
        "agentlog_otel_traces_expired_total",
        "agentlog_otel_duplicate_events_total")},
}


def readme_series() -> dict[str, frozenset[str]]:
    """``{metric name: label names}`` from the README's Metrics section."""
    text = README.read_text()
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    series = {m.group(1): frozenset(filter(None, (m.group(2) or "").split(",")))
              for m in re.finditer(r"`([a-z][a-z0-9_]*)(?:\{([a-z_,]+)\})?`", section)}
    assert len(series) >= 10, f"the README's Metrics section no longer parses as a list of series: {series}"
    return series


def parse_exposition(text: str) -> tuple[dict[str, str], dict[str, list[tuple[dict[str, str], float]]]]:
    """Prometheus text → (``{name: type}``, ``{name: [(labels, value)]}``)."""
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
    parsed = metrics.parse_exposition(text)  # the worker's own reader of what it renders (it skips malformed lines)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(parsed) == len(lines), f"not all Prometheus sample lines: {lines}"
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for name, labels, value in parsed:
        samples[name].append((dict(labels), value))
    return types, samples


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.read().decode()


def _value(samples, name: str, **labels: str) -> float | None:
    for got, value in samples.get(name, []):
        if got == labels:
            return value
    return None


def test_metrics_lists_every_documented_series_and_health_is_ok(settings):
    documented = readme_series()
    settings = settings.replace(web_port=free_port())
    port = settings.web_port
    asyncio.run(ensure_topics(settings))
    worker = WorkerProcess(settings, sink=True, web=True, log_name="metrics-worker").start()

    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    began = next(d for d in docs if d["type"] == "core.workflowChain.event")
    # Legal envelope, no dispatch of that worker: committed, and flagged unknown_dispatch.
    orphan = {"eventId": f"{run_id}:orphan", "runId": run_id, "type": "core.workflowChain.event",
              "payload": {"parentRunId": run_id, "phase": "child.failed", "workerId": "worker-zz"},
              "timestamp": "2025-01-15T10:01:00.000Z", "sequence": len(docs), "causationId": began["eventId"]}
    duplicate = {**docs[1], "sequence": len(docs) + 1}  # an eventId already committed
    source_id, replay_id = f"src-{uuid.uuid4().hex[:8]}", f"rep-{uuid.uuid4().hex[:8]}"

    def small_run(rid: str, replay_of: dict | None = None) -> list[dict]:
        started = {"bindings": {"engineVersion": "1.4.0"}, **({"replayOf": replay_of} if replay_of else {})}
        return [
            {"eventId": f"{rid}:0", "runId": rid, "type": "run.started", "payload": started,
             "timestamp": "2025-01-15T10:00:00.000Z", "sequence": 0},
            {"eventId": f"{rid}:1", "runId": rid, "type": "variable.changed", "payload": {"name": "x", "value": 1},
             "timestamp": "2025-01-15T10:00:01.000Z", "sequence": 1, "causationId": f"{rid}:0"},
            {"eventId": f"{rid}:2", "runId": rid, "type": "run.completed", "payload": {"status": "completed"},
             "timestamp": "2025-01-15T10:00:02.000Z", "sequence": 2, "causationId": f"{rid}:1"},
        ]

    source = small_run(source_id)
    replay = small_run(replay_id, {"sourceRunId": source_id, "fromSeq": 1, "mode": "verify"})
    good = len(docs) + 1 + len(source) + len(replay)

    async def scenario():
        async def healthy():
            try:
                return await asyncio.to_thread(_get, port, "/health")
            except OSError:
                return None

        status, body = await wait_until(healthy, timeout=180, what="the worker's /health", worker=worker)
        assert status == 200 and json.loads(body)["ok"] is True, body

        assert (await publish_docs(settings, docs + [orphan] + source, wire="json")).accepted == len(docs) + 1 + len(source)
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")
        await producer.start()
        try:  # bypass the SDK's validation: the worker must refuse these itself
            await producer.send_and_wait(topic_name(settings, "ingest"), key=run_id.encode(), value=jcs(duplicate))
            await producer.send_and_wait(topic_name(settings, "ingest"), key=run_id.encode(),
                                         value=b"\x07not a framed value")
        finally:
            await producer.stop()

        async def source_committed():
            return len(await read_run(settings, source_id)) == len(source)

        await wait_until(source_committed, what="the replay's source run committed", worker=worker)
        assert (await publish_docs(settings, replay, wire="json")).accepted == len(replay)

        async def verdict():
            found = [v async for _, _, _, v in read_topic(settings, "verdicts", key=replay_id)
                     if v.get("replayRunId") == replay_id]
            return found[-1] if found else None

        written = await wait_until(verdict, what="the replay verdict", worker=worker)

        driven = set(documented) - set(NOT_DRIVEN)

        async def scraped():
            status, text = await asyncio.to_thread(_get, port, "/metrics")
            assert status == 200
            types, samples = parse_exposition(text)
            done = (all(samples.get(name) for name in driven)
                    and _value(samples, "agentlog_events_accepted_total") == good
                    and _value(samples, "agentlog_events_rejected_total", reason="bad_magic") == 1
                    and _value(samples, "agentlog_sink_rows_total", table="log") == good)
            return (types, samples) if done else None

        try:
            types, samples = await wait_until(scraped, timeout=180, interval=1.0, what="every driven series",
                                              worker=worker)
        except AssertionError:  # the checks below name what is missing
            types, samples = parse_exposition((await asyncio.to_thread(_get, port, "/metrics"))[1])
        status, body = await asyncio.to_thread(_get, port, "/health")
        return written, types, samples, (status, body)

    try:
        written, types, samples, health = asyncio.run(scenario())
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()

    assert health[0] == 200 and json.loads(health[1])["ok"] is True, health
    missing = sorted(name for name in documented if name not in types)
    assert missing == [], f"documented in README.md but not exposed: {missing}"
    silent = sorted(name for name in set(documented) - set(NOT_DRIVEN) if not samples.get(name))
    assert silent == [], f"documented series without a sample after the scenario: {silent}"
    wrong_labels = {name: sorted({tuple(sorted(labels)) for labels, _ in samples.get(name, [])
                                  if set(labels) != documented[name]})
                    for name in documented}
    assert {k: v for k, v in wrong_labels.items() if v} == {}, "labels differ from the README's"
    assert types["agentlog_runs_in_flight"] == "gauge" and types["agentlog_sink_lag_seconds"] == "gauge"
    assert types["agentlog_events_accepted_total"] == "counter"

    # The counts this scenario fixes.
    assert _value(samples, "agentlog_events_accepted_total") == good
    assert _value(samples, "agentlog_events_rejected_total", reason="bad_magic") == 1
    assert _value(samples, "agentlog_events_rejected_total", reason="duplicate_event_id") == 1
    assert _value(samples, "agentlog_duplicates_dropped_total") == 1
    assert _value(samples, "agentlog_violations_total", code="unknown_dispatch") == 1
    chain = [d for d in docs if d["type"] == "core.workflowChain.event"]
    assert sum(v for labels, v in samples["agentlog_handoff_transitions_total"] if labels["derived"] == "false") \
        == len(chain)
    assert _value(samples, "agentlog_snapshots_total") == 3  # one terminal status per run
    assert _value(samples, "agentlog_replay_verdicts_total", verdict=written["verdict"]) == 1
    assert _value(samples, "agentlog_sink_rows_total", table="log") == good
