"""Redaction on a real broker, worker and chdb (issue #42): the default policy, metrics-only, replay of a redacted run.

Planted values carry markers (``MARK-<hex>``) where their form allows it, so the marker scan of
``tests/integration/test_personal_data.py`` (imported, not copied) looks for them everywhere the store keeps
anything: no topic but ``ingest``, no file under the home, no RocksDB entry, no audit-store row may hold one. A
sealed value would pass that scan too, so the runs are also read back through the keyring (``read_run``,
``agentlog export``): what opens is the redacted form, with the payload's ``$redactions`` saying what was done.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from agentlog import Publisher
from agentlog.audit.server import query_via_worker
from agentlog.replay.host import host_verdicts
from agentlog.replay.regression import record, replay_test
from agentlog.schemas.content import REDACTIONS
from agentlog.schemas.errors import ReplayError
from agentlog.streams.admin import ensure_topics
from agentlog.streams.reader import read_run
from tests.integration.test_personal_data import _scan, _sink_caught_up, _store_rows, found_in
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, all_committed, free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

CARD = "4111 1111 1111 1111"


def _worker(settings) -> WorkerProcess:
    settings = settings.replace(web_port=free_port(), otlp_port=0)
    asyncio.run(ensure_topics(settings))
    return WorkerProcess(settings, sink=True, web=True).start()


def _marks() -> dict[str, str]:
    """Values the default policy redacts, each holding a marker: an e-mail address and an API key."""
    return {"email": f"MARK-{uuid.uuid4().hex}@example.com", "api_key": f"sk-MARK-{uuid.uuid4().hex}"}


def _marker(value: str) -> str:
    return value[value.index("MARK-"):][:37]


def _program(planted: dict[str, str]):
    """A pydantic-ai support agent (offline model) whose tool returns a customer record with the planted values."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agentlog.replay.frameworks.pydantic_ai import ReplayModel, ReplayTools

    def program(recorder) -> str:
        def llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            if not returned:
                return ModelResponse(parts=[ToolCallPart("customer", {"customer_id": "c-42"}, tool_call_id="c1")])
            return ModelResponse(parts=[TextPart(f"Found it: {returned[0]}")])

        agent = Agent(ReplayModel(recorder, inner=FunctionModel(llm), node="support"), name="support",
                      instructions="Look the customer up.", capabilities=[ReplayTools(recorder)])

        @agent.tool_plain
        def customer(customer_id: str) -> str:
            """The customer's record."""
            return (f"customer {customer_id}: e-mail {planted['email']}, card on file {CARD}, "
                    f"integration key {planted['api_key']}")

        return str(agent.run_sync("Who is customer c-42?").output)

    return program


def test_the_default_policy_keeps_planted_values_out_and_a_replay_matches(settings):
    worker = _worker(settings)
    settings = worker.settings
    try:
        planted = _marks()
        marks = {_marker(v) for v in planted.values()}
        program = _program(planted)
        docs = record(program, run_id=f"redact-{uuid.uuid4().hex[:8]}", settings=settings)
        run_id = docs[0]["runId"]
        assert found_in(json.dumps(docs).encode(), marks) == marks and CARD in json.dumps(docs)  # as recorded
        asyncio.run(wait_until(lambda: all_committed(settings, {run_id: docs}), timeout=180,
                               what="the run committed", worker=worker))

        stored = [c["doc"] for c in asyncio.run(read_run(settings, run_id))]  # opened through the keyring
        text = json.dumps(stored, ensure_ascii=False)
        assert found_in(text.encode(), marks) == set() and CARD not in text and CARD.replace(" ", "") not in text
        rules = {r["rule"] for d in stored if isinstance(d["payload"], dict) for r in d["payload"].get(REDACTIONS, [])}
        assert {"email", "card", "api_key"} <= rules
        returned = next(d for d in stored if d["type"] == "agent.toolReturned")
        assert "[REDACTED:email]" in json.dumps(returned["payload"]) and "[REDACTED:card]" in json.dumps(
            returned["payload"])
        exported = agentlog_cli(settings, "export", "--run", run_id)
        assert exported.returncode == 0, exported.stderr
        assert found_in(exported.stdout.encode(), marks) == set() and CARD not in exported.stdout

        # A replay with the unchanged program: here (the comparison applies the same policy to the replay's events)
        # and in the worker (which judges the published replay, redacted by the sequencer like the source)
        replayed = replay_test(run_id, program, settings=settings)
        assert replayed.verdict == "match", replayed.describe()

        async def verdict():
            found = await host_verdicts(settings, replayed.replay_run_id)
            return found[-1] if found else None

        judged = asyncio.run(wait_until(verdict, timeout=180, what="the replay's verdict", worker=worker))
        assert judged["verdict"] == "match", judged

        asyncio.run(_sink_caught_up(settings, worker))
        # every marker is in the ingest topic (the one plaintext buffer), none anywhere past the sequencer
        assert _scan(settings, worker, marks, {"ingest"}) == marks  # (the worker stopped: the store is ours)
        tables, _ = _store_rows(settings)
        assert not [t for t, rows in tables.items() if CARD.replace(" ", "").encode() in rows or CARD.encode() in rows]
    finally:
        worker.stop()


def test_metrics_only_stores_no_content_and_refuses_replay(settings, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[topics."{settings.topic_prefix}"]\nmetrics_only = true\n')
    worker = _worker(settings.replace(redaction_policy=str(policy)))
    settings = worker.settings
    try:
        run_id = f"metrics-{uuid.uuid4().hex[:8]}"
        marks = {f"MARK-{uuid.uuid4().hex}-{field}" for field in ("input", "messages", "output", "variable")}
        m = dict(zip(("input", "messages", "output", "variable"), sorted(marks), strict=True))

        async def publish() -> list[dict[str, Any]]:
            async with Publisher(settings) as pub:
                run = pub.run(run_id)
                docs = [await run.emit("run.started", {"input": m["input"]}, node_id="start")]
                docs.append(await run.emit("agent.invocation.started", {
                    "request": {"provider": "openai", "model": "gpt-5", "messages": [
                        {"role": "user", "content": m["messages"]}]},
                    "cacheKey": "sha256:" + "0" * 64, "recipe": "openwop-semantic-request-v2"}, node_id="support"))
                docs.append(await run.emit("agent.invocation.completed", {
                    "cacheKey": "sha256:" + "0" * 64, "envelope": {"kind": "message", "text": m["output"]}},
                    node_id="support"))
                docs.append(await run.emit("provider.usage", {"provider": "openai", "model": "gpt-5",
                                                              "inputTokens": 120, "outputTokens": 30,
                                                              "costCents": 2}, node_id="support"))
                docs.append(await run.emit("variable.changed", {"name": "answer", "value": m["variable"]},
                                           node_id="support"))
                docs.append(await run.emit("run.completed", {"status": "completed"}, node_id="end"))
                return docs

        docs = asyncio.run(publish())
        asyncio.run(wait_until(lambda: all_committed(settings, {run_id: docs}), timeout=180,
                               what="the run committed", worker=worker))
        stored = [c["doc"] for c in asyncio.run(read_run(settings, run_id))]
        assert [d["type"] for d in stored] == [d["type"] for d in docs]  # metadata kept: types, ids, names, usage
        assert [d["eventId"] for d in stored] == [d["eventId"] for d in docs]
        assert stored[3]["payload"] == {"provider": "openai", "model": "gpt-5", "inputTokens": 120,
                                        "outputTokens": 30, "costCents": 2}
        assert stored[4]["payload"] == {"name": "answer", REDACTIONS: [
            {"path": "payload.value", "rule": "metrics-only", "action": "drop", "count": 1}]}
        assert found_in(json.dumps(stored).encode(), marks) == set()

        with pytest.raises(ReplayError) as refused:
            replay_test(run_id, lambda recorder: None, settings=settings)
        assert refused.value.code == "metrics_only"

        asyncio.run(_sink_caught_up(settings, worker))
        usage = query_via_worker(settings, {"sql": "SELECT sum(input_tokens), sum(output_tokens) FROM events "
                                                   f"WHERE run_id = '{run_id}'"})
        assert usage is not None and [int(v) for v in usage["rows"][0]] == [120, 30]  # analytics still add up
        assert _scan(settings, worker, marks, {"ingest"}) == marks
    finally:
        worker.stop()
