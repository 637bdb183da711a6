"""Mock mode (RFC 0041 §C): a replaying host gets the recorded results instead of calling out.

One small agent program runs three times against a real worker: recorded with a "live" model
and tool; replayed in mock mode with a model that would now answer differently (and must not be
called) — the run matches; replayed live with that model — the run diverges, which shows the
match above came from the recorded results and that this test can fail.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agentlog.replay.host import host_verdicts
from agentlog.replay.mock import MockReplaySession, open_mock_session
from agentlog.schemas.errors import ReplayError
from agentlog.streams.publisher import Publisher
from agentlog.streams.replay_client import start_replay
from tests.integration.replay.helpers import committed
from tests.integration.worker.worker_proc import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

REQUEST = {"provider": "anthropic", "model": "claude-x",
           "messages": [{"role": "user", "content": "Which Q4 incident was worst?"}], "temperature": 0}
ARGS = {"q": "Q4 incidents", "limit": 10}
BINDINGS = {"engineVersion": "1.4.0", "modeVersion": "m1", "configVersion": "c7", "policyVersion": "p2"}

Model = Callable[[str, int, str], dict[str, Any]]
Tool = Callable[[str, int, str, Any], Any]


async def program(run, model: Model, tool: Tool, *, start) -> None:
    """The host's workflow: plan with the LLM, search with a tool, record what it learnt."""
    started = await start({"bindings": dict(BINDINGS)}, node_id="start")
    await run.emit("variable.changed", {"name": "goal", "value": "worst Q4 incident"}, node_id="start",
                   caused_by=started)
    req = await run.llm_request(REQUEST, node_id="planner", caused_by=started)
    outcome = model("planner", 0, req["payload"]["cacheKey"])
    if outcome["kind"] == "refusal":
        await run.llm_refusal(req, outcome.get("reason", "refused"))
        await run.emit("run.failed", {"status": "failed"}, node_id="end")
        return
    answer = await run.llm_response(req, outcome["envelope"], outcome.get("usage"))
    call = await run.tool_call("search", ARGS, node_id="research", caused_by=answer)
    result = tool("research", 0, "search", ARGS)
    await run.tool_result(call, result)
    await run.emit("variable.changed", {"name": "worst", "value": result["worst"]}, node_id="research")
    await run.emit("channel.written", {"channel": "answer", "value": outcome["envelope"]["answer"]}, node_id="end")
    await run.emit("run.completed", {"status": "completed"}, node_id="end")


def recorded_model(node, attempt, key):
    return {"kind": "valid", "envelope": {"answer": "INC-42 was worst"}, "usage": {"inputTokens": 40, "outputTokens": 9}}


def recorded_tool(node, attempt, tool, args):
    return {"hits": 3, "worst": "INC-42"}


def changed_model(node, attempt, key):
    return {"kind": "valid", "envelope": {"answer": "INC-40 was worst"}, "usage": {"inputTokens": 41, "outputTokens": 9}}


async def _verdict(settings, worker, run_id):
    async def found():
        got = await host_verdicts(settings, run_id)
        return got[-1] if got else None

    return await wait_until(found, what=f"verdict for {run_id}", worker=worker)


def test_mock_replay_gets_recorded_results_and_matches(settings, worker):
    source_id = f"src-{uuid.uuid4().hex[:8]}"

    async def scenario():
        async with Publisher(settings) as pub:
            run = pub.run(source_id)
            await program(run, recorded_model, recorded_tool, start=lambda p, **kw: run.emit("run.started", p, **kw))
        await wait_until(lambda: committed(settings, source_id, 9), what="source committed", worker=worker)

        session = await open_mock_session(settings, source_id)
        async with Publisher(settings) as pub:
            mock = await start_replay(pub, source_id, mode="mock")
            await program(mock.run, session.recorded_llm, session.recorded_tool, start=mock.started)
            live = await start_replay(pub, source_id, mode="live")
            await program(live.run, changed_model, recorded_tool, start=live.started)
            # The whole run as the copied prefix: nothing re-executed, so it must match.
            copied = await start_replay(pub, source_id, mode="live", from_seq=9)

        v = await _verdict(settings, worker, mock.run_id)
        assert (v["verdict"], v["mode"], v["sourceRunId"]) == ("match", "mock", source_id)
        w = await _verdict(settings, worker, live.run_id)
        assert w["verdict"] == "diverged"
        assert w["firstDivergence"]["path"] == "payload.envelope.answer"
        c = await _verdict(settings, worker, copied.run_id)
        assert c["verdict"] == "match", c

    asyncio.run(scenario())


def test_mock_session_lookups_follow_the_recorded_calls(settings, worker):
    source_id = f"src-{uuid.uuid4().hex[:8]}"

    async def scenario():
        async with Publisher(settings) as pub:
            run = pub.run(source_id)
            await program(run, recorded_model, recorded_tool, start=lambda p, **kw: run.emit("run.started", p, **kw))
        log = await wait_until(lambda: committed(settings, source_id, 9), what="source committed", worker=worker)
        return [c["doc"] for c in log]

    docs = asyncio.run(scenario())
    key = next(d for d in docs if d["type"] == "agent.invocation.started")["payload"]["cacheKey"]
    session = asyncio.run(open_mock_session(settings, source_id))
    assert isinstance(session, MockReplaySession)
    assert session.recorded_llm("planner", 0, key)["envelope"] == {"answer": "INC-42 was worst"}
    with pytest.raises(ReplayError) as second:  # the original asked once: there is no second answer
        session.recorded_llm("planner", 0, key)
    assert second.value.code == "replay_cache_miss"
    assert session.recorded_tool("research", 0, "search", ARGS) == {"hits": 3, "worst": "INC-42"}
    with pytest.raises(ReplayError):
        session.recorded_tool("research", 0, "search", {**ARGS, "limit": 11})
    with pytest.raises(ReplayError):
        asyncio.run(open_mock_session(settings, "no-such-run"))
