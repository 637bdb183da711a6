"""The whole demo on the real broker: a real worker process, the SDK, replay verdicts, audit queries.

Expected indexes are read from the audit history (the run-timeline rows ClickHouse returns),
not from the demo's own bookkeeping, so a demo that misplaces a divergence fails here.

The host-replay verdicts must be the worker's: the tour falls back to ``compare_runs`` on the
exported runs when no worker verdict arrives in time (``agentlog.demo.tour._host_replay``), which
would hide a broken verdict path. So the test requires the tour to say "worker verdict" and reads
each verdict back from the verdicts topic itself.
"""

from __future__ import annotations

import asyncio

import pytest
from rich.console import Console

from agentlog.demo.tour import run_demo, stop_worker
from agentlog.streams.reader import read_topic
from tests.tools import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


async def _worker_verdicts(settings, replay_run_id: str) -> list[dict]:
    return [v async for _, _, _, v in read_topic(settings, "verdicts", key=replay_run_id)
            if v.get("replayRunId") == replay_run_id]


def test_demo_end_to_end(settings):
    demo_settings = settings.replace(web_port=free_port())
    try:
        summary = run_demo(demo_settings, Console(quiet=True))
    finally:
        stop_worker(demo_settings)

    assert summary.head_verified and len(summary.head_hash) == 64

    timeline = summary.queries["run-timeline"]
    rows = [dict(zip(timeline["columns"], row, strict=False)) for row in timeline["rows"]]
    assert [r["sequence"] for r in rows] == list(range(summary.events))
    assert rows[-1]["hash"] == summary.head_hash
    tool_result_at = next(r["sequence"] for r in rows if r["type"] == "agent.toolReturned")
    answered_at = next(r["sequence"] for r in rows
                       if r["type"] == "agent.invocation.completed" and r["node_id"] == "worker-1")
    assert sum(r["type"] == "envelope.refusal" for r in rows) == 1

    phases = sorted((t["workerId"], t["phase"]) for t in summary.transitions)
    assert phases == sorted([("worker-1", "dispatch.began"), ("worker-1", "dispatch.succeeded"),
                             ("worker-1", "child.completed"), ("worker-1", "output.harvested"),
                             ("worker-2", "dispatch.began"), ("worker-2", "dispatch.failed")])

    assert summary.offset_replay["status"] == "match", summary.offset_replay
    assert 0 < summary.offset_replay["fromSeq"] < summary.events

    tool, refusal = summary.replays
    # From the worker, not from the tour's offline fallback.
    assert [r["source"] for r in summary.replays] == ["worker verdict", "worker verdict"], summary.replays
    for replay, verdict, code, at in ((tool, "diverged", "replay_diverged", tool_result_at),
                                      (refusal, "diverged_at_refusal", "replay_diverged_at_refusal", answered_at)):
        written = asyncio.run(_worker_verdicts(demo_settings, replay["replayRunId"]))
        assert written, f"no verdict for {replay['replayRunId']} on the worker's verdicts topic"
        assert {(v["verdict"], v["errorCode"], (v["firstDivergence"] or {}).get("atSequence")) for v in written} == {
            (verdict, code, at)}, written
    assert (tool["verdict"], tool["errorCode"], tool["atSequence"]) == ("diverged", "replay_diverged", tool_result_at)
    assert tool["event"] == "replay.diverged" and tool["path"].startswith("payload.result")
    assert (refusal["verdict"], refusal["errorCode"], refusal["atSequence"]) == (
        "diverged_at_refusal", "replay_diverged_at_refusal", answered_at)
    assert refusal["event"] == "replay.divergedAtRefusal"
    assert (refusal["expected"], refusal["actual"]) == ("valid", "refusal")

    latency = summary.queries["handoff-latency"]
    workers = {dict(zip(latency["columns"], row, strict=False))["worker_id"] for row in latency["rows"]}
    assert workers == {"worker-1", "worker-2"}
    usage = [dict(zip(summary.queries["usage"]["columns"], row, strict=False)) for row in summary.queries["usage"]["rows"]]
    assert [(u["run_id"], u["calls"]) for u in usage] == [(summary.run_id, 3)]
    assert summary.ok  # what `agentlog demo` exits 0 on
