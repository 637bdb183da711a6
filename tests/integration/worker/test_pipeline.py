"""The processors on the real broker: committed log, handoff transitions, snapshots, rejections.

A real ``agentlog worker`` process runs against a real KRaft broker; runs are
published through the SDK's ``publish_docs`` and everything is read back with a
plain aiokafka reader, deduplicated by (runId, sequence) as any reader must.
"""

from __future__ import annotations

import asyncio
import copy
import uuid

import pytest

from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run, read_topic
from agentlog.streams.security import kcat_args
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import require_tool, stored_docs
from tests.unit.core.runs import child_runs, realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


async def _records(settings, short: str) -> list[dict]:
    return [value async for _, _, _, value in read_topic(settings, short)]


def _expected_head(docs: list[dict]) -> str:
    """The chain over ``docs`` as stored (``stored_docs``): the log's hashes cover the sealed form."""
    head = GENESIS
    for doc in docs:
        head = chain_hash(head, doc)
    return head


def _chains(transitions: list[dict]) -> dict[str, list[dict]]:
    by_dispatch: dict[str, list[dict]] = {}
    seen = set()
    for t in transitions:
        if (t["dispatchId"], t["phase"]) in seen:
            continue  # redelivered duplicate; readers dedup
        seen.add((t["dispatchId"], t["phase"]))
        by_dispatch.setdefault(t["workerId"], []).append(t)
    return by_dispatch


@pytest.fixture
def worker(settings):
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings.replace(handoff_mode="auto"),
                         constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 5}).start()
    yield proc
    proc.stop()


def test_check_mode_run_commits_in_order_with_host_transitions(settings, worker):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    chain_docs = [d for d in docs if d["type"] == "core.workflowChain.event"]

    async def scenario():
        summary = await publish_docs(settings, docs, wire="avro")
        assert summary.accepted == len(docs) and not summary.rejected
        committed = await wait_until(
            lambda: _committed_if(settings, run_id, len(docs)), what="committed log", worker=worker)
        assert [c["doc"] for c in committed] == docs
        for prev, cur in zip([None, *committed], committed, strict=False):
            assert cur["prevHash"] == (prev["hash"] if prev else GENESIS)
        assert committed[-1]["hash"] == _expected_head(await stored_docs(settings, run_id))

        transitions = await wait_until(
            lambda: _transitions_for(settings, run_id, len(chain_docs)), what="transitions", worker=worker)
        assert [(t["eventId"], t["phase"]) for t in transitions] == [
            (d["eventId"], d["payload"]["phase"]) for d in chain_docs]
        assert all(t["derived"] is False for t in transitions)
        for t, d in zip(transitions, chain_docs, strict=False):
            assert t["causationId"] == d["causationId"]

        snapshots = [s for s in await _records(settings, "snapshots") if s["runId"] == run_id]
        final = max(snapshots, key=lambda s: s["atSequence"])
        assert final["atSequence"] == len(docs) - 1
        assert final["headHash"] == committed[-1]["hash"]
        assert final["state"]["status"] == "completed"
        assert final["state"]["variables"].get("parentResult") is not None
        violations = [v for v in await _records(settings, "violations") if v["runId"] == run_id]
        assert violations == []

    asyncio.run(scenario())


def test_derive_mode_emits_upstream_chain(settings, worker):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    parent = realistic_run(run_id, mode="derive")
    children = child_runs(run_id)
    decided = [d for d in parent if d["type"] == "runOrchestrator.decided"]

    async def scenario():
        summary = await publish_docs(settings, parent + [d for run in children.values() for d in run], wire="json")
        assert not summary.rejected
        transitions = await wait_until(
            lambda: _transitions_for(settings, run_id, 9), what="derived transitions", worker=worker)
        chains = _chains(transitions)
        a, b, c = chains["worker-a"], chains["worker-b"], chains["worker-c"]
        assert [t["phase"] for t in a] == ["dispatch.began", "dispatch.succeeded", "child.completed", "output.harvested"]
        assert a[-1]["harvestedKeys"] == ["parentResult"]
        assert [t["phase"] for t in b] == ["dispatch.began", "dispatch.failed"]
        assert [t["phase"] for t in c] == ["dispatch.began", "dispatch.succeeded", "child.cancelled"]
        assert a[0]["causationId"] == decided[0]["eventId"]
        assert c[0]["causationId"] == decided[1]["eventId"]
        for chain in (a, b, c):
            assert all(t["derived"] for t in chain)
            for prev, cur in zip(chain, chain[1:], strict=False):
                assert cur["causationId"] == prev["eventId"]

    asyncio.run(scenario())


def test_bad_sequences_are_rejected_and_processing_continues(settings, worker):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    good = docs[:4]
    gap = {**copy.deepcopy(docs[4]), "sequence": 9, "eventId": f"{run_id}:gap"}
    dup = copy.deepcopy(docs[1])  # same eventId again
    dangling = {**copy.deepcopy(docs[4]), "causationId": "no-such-event"}
    conflict = {**copy.deepcopy(docs[4]), "sequence": 2, "eventId": f"{run_id}:conflict"}
    rest = docs[4:]
    # An illegal transition: child.completed straight after dispatch.began of worker-a.
    began = next(d for d in docs if d["type"] == "core.workflowChain.event")
    illegal = {
        "eventId": f"{run_id}:illegal", "runId": run_id, "type": "core.workflowChain.event",
        "payload": {"phase": "child.completed", "workerId": began["payload"]["workerId"],
                    "parentRunId": run_id, "childRunId": "x"},
        "timestamp": began["timestamp"], "sequence": len(docs), "causationId": began["eventId"],
    }

    async def scenario():
        await publish_docs(settings, good + [gap, dup, dangling, conflict] + rest + [illegal], wire="json")
        committed = await wait_until(
            lambda: _committed_if(settings, run_id, len(docs) + 1), what="committed log", worker=worker)
        assert [c["doc"]["eventId"] for c in committed] == [d["eventId"] for d in docs] + [illegal["eventId"]]
        rejections = await wait_until(lambda: _rejections_for(settings, run_id, 4), what="rejections", worker=worker)
        assert sorted(r["reason"] for r in rejections) == sorted(
            ["sequence_gap", "duplicate_event_id", "dangling_causation", "sequence_conflict"])
        assert all(r["source"]["offset"] >= 0 and r["raw"] for r in rejections)
        violations = await wait_until(
            lambda: _violations_for(settings, run_id), what="violations", worker=worker)
        assert "illegal_transition" in [v["code"] for v in violations]
        assert violations[0]["eventId"] == illegal["eventId"]

    asyncio.run(scenario())


async def _committed_if(settings, run_id: str, n: int):
    committed = await read_run(settings, run_id)
    return committed if len(committed) >= n else None


async def _transitions_for(settings, run_id: str, n: int):
    ts = [t for t in await _records(settings, "transitions") if t["parentRunId"] == run_id]
    unique = {(t["dispatchId"], t["phase"]) for t in ts}
    return ts if len(unique) >= n else None


async def _rejections_for(settings, run_id: str, n: int):
    rs = [r for r in await _records(settings, "rejections") if r.get("runId") == run_id]
    return rs if len(rs) >= n else None


async def _violations_for(settings, run_id: str):
    return [v for v in await _records(settings, "violations") if v["runId"] == run_id] or None


def test_kcat_json_lines_reach_the_committed_log_like_sdk_events(settings, worker):
    """A non-Python host (Debian's kcat, librdkafka) publishing plain JSON lines."""
    import json
    import subprocess

    from agentlog.streams.topics import topic_name

    require_tool("kcat")
    run_id = f"kcat-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    lines = "".join(f"{run_id}\t{json.dumps(d)}\n" for d in docs)
    proc = subprocess.run(
        ["kcat", "-P", *kcat_args(settings), "-t", topic_name(settings, "ingest"), "-K", "\t",
         "-X", "topic.partitioner=murmur2_random", "-X", "enable.idempotence=true"],
        input=lines.encode(), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()

    async def scenario():
        committed = await wait_until(
            lambda: _committed_if(settings, run_id, len(docs)), what="committed log", worker=worker)
        assert [c["doc"] for c in committed] == docs
        assert committed[-1]["hash"] == _expected_head(await stored_docs(settings, run_id))

    asyncio.run(scenario())
