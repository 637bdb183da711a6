"""Host replay comparison on the real broker (RFC 0041 §C).

A host re-executes a recorded run as a new run whose ``run.started`` carries ``replayOf``; when
that run reaches a terminal status the worker compares it with its source and writes a verdict.
"""

from __future__ import annotations

import asyncio
import copy
import uuid

import pytest

from agentlog.core.sealing import is_sealed
from agentlog.replay.host import host_verdicts
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_topic
from agentlog.streams.topics import partition_for
from tests.integration.replay.helpers import committed
from tests.integration.worker.worker_proc import wait_until
from tests.unit.replay.runs import as_replay, index_of, llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


async def _source(settings, worker) -> list[dict]:
    run_id = f"src-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    await publish_docs(settings, docs, wire="avro")
    await wait_until(lambda: committed(settings, run_id, len(docs)), what="source committed", worker=worker)
    return docs


async def _verdict(settings, worker, replay_id: str) -> dict:
    async def found():
        got = await host_verdicts(settings, replay_id)
        return got[-1] if got else None

    return await wait_until(found, what=f"verdict for {replay_id}", worker=worker)


def _same_partition_id(settings, like: str) -> str:
    target = partition_for(settings, like)
    while True:
        candidate = f"rep-{uuid.uuid4().hex[:8]}"
        if partition_for(settings, candidate) == target:
            return candidate


def test_faithful_replay_matches_and_dry_run_writes_no_verdict(settings, worker):
    async def scenario():
        source = await _source(settings, worker)
        dry_id = f"rep-{uuid.uuid4().hex[:8]}"
        live_id = _same_partition_id(settings, dry_id)  # same partition: compared after the dry run
        dry = as_replay(source, replay_run_id=dry_id, mode="dry_run")
        live = as_replay(source, replay_run_id=live_id, from_seq=4, mode="live")
        assert (await publish_docs(settings, dry + live, wire="avro")).accepted == len(dry) + len(live)

        verdict = await _verdict(settings, worker, live_id)
        assert verdict["verdict"] == "match" and verdict["errorCode"] is None
        assert (verdict["sourceRunId"], verdict["mode"]) == (source[0]["runId"], "live")
        assert verdict["firstDivergence"] is None and verdict["events"] == []
        assert verdict["comparedThrough"] == len(source) - 1
        # The dry run's terminal event came first on the same partition, so it was compared first.
        assert await host_verdicts(settings, dry_id) == []

    asyncio.run(scenario())


def test_changed_result_refusal_and_other_bindings(settings, worker):
    async def scenario():
        source = await _source(settings, worker)
        src_id = source[0]["runId"]

        tool_at = index_of(source, "agent.toolReturned")
        changed = as_replay(source, replay_run_id=f"rep-tool-{uuid.uuid4().hex[:6]}")
        changed[tool_at]["payload"]["result"]["hits"] = 4

        llm_at = index_of(source, "agent.invocation.completed")
        refused = as_replay(source, replay_run_id=f"rep-refuse-{uuid.uuid4().hex[:6]}")
        answer = refused[llm_at]
        refused[llm_at] = {**copy.deepcopy(answer), "type": "envelope.refusal",
                           "payload": {"cacheKey": answer["payload"]["cacheKey"], "reason": "policy: will not plan"}}

        what_if = as_replay(source, replay_run_id=f"rep-whatif-{uuid.uuid4().hex[:6]}")
        what_if[0]["payload"]["bindings"]["modeVersion"] = "m2"

        summary = await publish_docs(settings, changed + refused + what_if, wire="json")
        assert not summary.rejected, summary.rejected

        v = await _verdict(settings, worker, changed[0]["runId"])
        assert (v["verdict"], v["errorCode"]) == ("diverged", "replay_diverged")
        assert (v["firstDivergence"]["atSequence"], v["firstDivergence"]["path"]) == (tool_at, "payload.result.hits")
        assert (v["firstDivergence"]["expected"], v["firstDivergence"]["actual"]) == (3, 4)
        # on the topic (and in the audit store) the values a divergence names are sealed like the run's content
        stored = [value async for _, _, _, value in read_topic(settings, "verdicts", key=changed[0]["runId"])][-1]
        assert is_sealed(stored["firstDivergence"]["expected"]) and is_sealed(stored["firstDivergence"]["actual"])
        assert is_sealed(stored["firstDivergence"]["path"])  # below a payload member it names a value's keys
        assert [e["type"] for e in v["events"]] == ["replay.diverged"]
        event = v["events"][0]["payload"]
        assert (event["sourceRunId"], event["atSequence"], event["divergenceKind"]) == (src_id, tool_at, "output")
        assert event["originalEventId"] == source[tool_at]["eventId"]

        r = await _verdict(settings, worker, refused[0]["runId"])
        assert (r["verdict"], r["errorCode"]) == ("diverged_at_refusal", "replay_diverged_at_refusal")
        assert [e["type"] for e in r["events"]] == ["replay.divergedAtRefusal"]
        refusal = r["events"][0]["payload"]
        assert refusal["atSequence"] == llm_at and refusal["sourceRunId"] == src_id
        assert (refusal["originalEnvelopeKind"], refusal["replayEnvelopeKind"]) == ("valid", "refusal")
        assert refusal["refusalReason"] == "policy: will not plan"

        w = await _verdict(settings, worker, what_if[0]["runId"])
        assert w["verdict"] == "what-if" and w["errorCode"] is None
        assert w["bindingDiff"] == {"modeVersion": {"expected": "m1", "actual": "m2"}}

    asyncio.run(scenario())


def test_a_replay_of_an_unknown_source_gets_an_error_verdict(settings, worker):
    async def scenario():
        ghost = f"never-published-{uuid.uuid4().hex[:6]}"
        replay = as_replay(llm_run(ghost), replay_run_id=f"rep-ghost-{uuid.uuid4().hex[:6]}")
        assert (await publish_docs(settings, replay, wire="avro")).accepted == len(replay)
        v = await _verdict(settings, worker, replay[0]["runId"])
        assert (v["verdict"], v["errorCode"], v["sourceRunId"]) == ("error", "replay_source_missing", ghost)
        assert ghost in v["detail"] and v["events"] == [] and v["comparedThrough"] is None

    asyncio.run(scenario())
