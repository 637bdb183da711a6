"""Runs for the replay tests: the shared realistic run plus LLM/tool calls, and how a host replays it.

:func:`llm_run` is :func:`tests.unit.core.runs.realistic_run` (check mode) with a planner LLM call, a
tool call that is retried once, and the variable its result sets, spliced in after the first
``provider.usage``. :func:`as_replay` is what an honest replay host writes for it: a new run id,
freshly minted eventIds and child/call ids, other timestamps, ``replayOf`` on ``run.started`` —
only volatile differences, so the comparison must say ``match``.
"""

from __future__ import annotations

import copy
from typing import Any

from agentlog.schemas.canonical import jcs, sha256_hex
from agentlog.schemas.stability import parse_path
from tests.unit.core.runs import realistic_run

REQUEST = {
    "provider": "anthropic",
    "model": "claude-x",
    "messages": [{"role": "user", "content": "Which Q4 incident was worst?"}],
    "tools": [],
    "temperature": 0,
    "responseSchema": None,
}
ENVELOPE = {"kind": "next-worker", "answer": "dispatch worker-a and worker-b"}
TOOL_ARGS = {"q": "Q4 incidents", "limit": 10}
TOOL_RESULT = {"hits": 3, "ids": ["INC-40", "INC-41", "INC-42"]}


def _splice(run_id: str) -> list[tuple[str, Any, str, int | str | None]]:
    """(type, payload, nodeId, cause) for the inserted events; cause is an inserted index or 'decided'."""
    key = sha256_hex(jcs(REQUEST))
    return [
        ("agent.invocation.started",
         {"request": dict(REQUEST), "cacheKey": key, "recipe": "openwop-semantic-request-v2"}, "planner", "decided"),
        ("agent.invocation.completed",
         {"cacheKey": key, "envelope": dict(ENVELOPE), "usage": {"inputTokens": 40, "outputTokens": 12}},
         "planner", 0),
        ("agent.toolCalled", {"callId": f"{run_id}:call-1", "tool": "search", "args": dict(TOOL_ARGS)}, "research", None),
        ("node.retried", {"attempt": 1, "errorCode": "ERR_HTTP_503"}, "research", 2),
        ("agent.toolCalled", {"callId": f"{run_id}:call-2", "tool": "search", "args": dict(TOOL_ARGS)}, "research", 3),
        ("agent.toolReturned", {"callId": f"{run_id}:call-2", "result": copy.deepcopy(TOOL_RESULT)}, "research", 4),
        ("variable.changed", {"name": "searchHits", "value": 3}, "research", 5),
        ("provider.usage",
         {"provider": "anthropic", "model": "claude-x", "inputTokens": 40, "outputTokens": 12, "costCents": 2},
         "planner", 1),
    ]


def llm_run(run_id: str = "run-1") -> list[dict[str, Any]]:
    """The realistic run with LLM and tool calls; eventIds ``<runId>:<seq:04d>``, sequences 0..N."""
    base = realistic_run(run_id, "check")
    insert_at = 4  # after 0 run.started, 1 variable.changed, 2 decided, 3 provider.usage
    new_id = {}
    docs: list[dict[str, Any]] = []

    def mint(seq: int) -> str:
        return f"{run_id}:{seq:04d}"

    for doc in base[:insert_at]:
        docs.append(copy.deepcopy(doc))
        new_id[doc["eventId"]] = doc["eventId"]
    first = len(docs)
    for offset, (type_, payload, node, cause) in enumerate(_splice(run_id)):
        seq = first + offset
        doc = {"eventId": mint(seq), "runId": run_id, "type": type_, "payload": payload,
               "timestamp": f"2025-01-15T10:00:{seq:02d}.500Z", "sequence": seq, "nodeId": node}
        if cause == "decided":
            doc["causationId"] = base[2]["eventId"]
        elif cause is not None:
            doc["causationId"] = mint(first + cause)
        docs.append(doc)
    for doc in base[insert_at:]:
        moved = copy.deepcopy(doc)
        moved["sequence"] = len(docs)
        moved["eventId"] = mint(moved["sequence"])
        new_id[doc["eventId"]] = moved["eventId"]
        docs.append(moved)
    for doc in docs[first + len(_splice(run_id)):]:
        if "causationId" in doc:
            doc["causationId"] = new_id[doc["causationId"]]
    return docs


def index_of(run: list[dict[str, Any]], type_: str, nth: int = 0) -> int:
    """Sequence of the ``nth`` event of ``type_``."""
    found = [d["sequence"] for d in run if d["type"] == type_]
    return found[nth]


def as_replay(
    run: list[dict[str, Any]], *, replay_run_id: str = "replay-1", from_seq: int = 0, mode: str = "live"
) -> list[dict[str, Any]]:
    """What a replay host writes for ``run``: every id, clock and trace field new; behaviour identical."""
    source = run[0]["runId"]
    minted = {d["eventId"]: f"evt-{replay_run_id}-{d['sequence']:03d}-x7" for d in run}
    out = []
    for doc in copy.deepcopy(run):
        doc["runId"] = replay_run_id
        doc["eventId"] = minted[doc["eventId"]]
        if "causationId" in doc:
            doc["causationId"] = minted[doc["causationId"]]
        doc["timestamp"] = f"2026-03-02T08:{doc['sequence'] // 60:02d}:{doc['sequence'] % 60:02d}.123Z"
        payload = doc["payload"]
        for name in ("parentRunId", "childRunId", "callId"):
            if isinstance(payload, dict) and isinstance(payload.get(name), str):
                payload[name] = payload[name].replace(source, f"{replay_run_id}-fresh")
        if doc["type"] == "run.started":
            payload["replayOf"] = {"sourceRunId": source, "fromSeq": from_seq, "mode": mode}
        out.append(doc)
    # The parent run id is the run itself, not a fresh id: it must name the replay run exactly.
    for doc in out:
        payload = doc["payload"]
        if isinstance(payload, dict) and payload.get("parentRunId") == f"{replay_run_id}-fresh":
            payload["parentRunId"] = replay_run_id
    return out


def perturb_volatile(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Change latency, trace ids, human messages and raw bodies wherever a host would put them."""
    out = copy.deepcopy(run)
    for i, doc in enumerate(out):
        payload = doc["payload"]
        if not isinstance(payload, dict):
            continue
        if doc["type"] == "agent.invocation.completed":
            if isinstance(payload.get("usage"), dict):
                payload["usage"]["latencyMs"] = 900 + i
            payload["envelope"]["rawResponse"] = f"<raw body {i}>"
        if doc["type"] == "agent.invocation.started":
            payload["request"]["traceId"] = f"trace-{i}"
        if doc["type"] == "agent.toolReturned":
            payload["latencyMs"] = 15 + i
            payload["raw"] = "HTTP/1.1 200 OK ..."
        if doc["type"] == "provider.usage":
            payload["traceId"] = f"trace-{i}"
            payload["costEstimateUsd"] = 0.0001 * i
        if isinstance(payload.get("error"), dict):
            payload["error"]["message"] = "reworded for humans"
        if doc["type"] == "node.retried":
            payload["message"] = "upstream said 503, trying again"
    return out


def set_path(doc: Any, path: str, value: Any) -> None:
    """Set ``value`` at a concrete path (no wildcards), creating the last key if absent."""
    segments = parse_path(path)
    target = doc
    for seg in segments[:-1]:
        target = target[seg]
    target[segments[-1]] = value


def changed(value: Any) -> Any:
    """A value of the same JSON kind that is certainly different."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + "~changed"
    if isinstance(value, list):
        return value + ["extra"]
    if isinstance(value, dict):
        return {**value, "extra": 1}
    return "was-null"


# ---------------------------------------------------------------------------------------------
# Concurrent workers and run trees (lanes)


def concurrent_run(run_id: str = "par-1") -> list[dict[str, Any]]:
    """A planner dispatches worker-a and worker-b, which run at the same time in nodes ``wa``/``wb``.

    By sequence: 0 run.started · 1 node.dispatched A (child ``<run>.child-a``) · 2 node.dispatched
    B (child ``<run>.child-b``) · 3 toolCalled wa · 4 toolCalled wb · 5 toolReturned wa ·
    6 variable.changed aHits (wa) · 7 toolReturned wb · 8 variable.changed bPages (wb) ·
    9 run.completed. The workers' events interleave; each is caused within its own lane.
    """
    from tests.unit.core.runs import RunLog

    log = RunLog(run_id)
    log.add("run.started", {}, node="start")
    log.add("node.dispatched", {"childRunId": f"{run_id}.child-a", "childWorkflowId": "worker-a"},
            node="dispatch", cause=0)
    log.add("node.dispatched", {"childRunId": f"{run_id}.child-b", "childWorkflowId": "worker-b"},
            node="dispatch", cause=0)
    log.add("agent.toolCalled", {"callId": f"{run_id}:call-a", "tool": "search", "args": {"q": "incidents"}},
            node="wa", cause=1)
    log.add("agent.toolCalled", {"callId": f"{run_id}:call-b", "tool": "fetch", "args": {"url": "https://x/q4"}},
            node="wb", cause=2)
    log.add("agent.toolReturned", {"callId": f"{run_id}:call-a", "result": {"hits": 3}}, node="wa", cause=3)
    log.add("variable.changed", {"name": "aHits", "value": 3}, node="wa", cause=5)
    log.add("agent.toolReturned", {"callId": f"{run_id}:call-b", "result": {"pages": 2}}, node="wb", cause=4)
    log.add("variable.changed", {"name": "bPages", "value": 2}, node="wb", cause=7)
    log.add("run.completed", {}, node="end", cause=8)
    return log.docs


def worker_child_run(run_id: str, node: str) -> list[dict[str, Any]]:
    """A worker's child run: one LLM call, one tool call, the variable it sets, completed.

    By sequence: 0 run.started · 1 invocation.started · 2 invocation.completed · 3 toolCalled ·
    4 toolReturned · 5 variable.changed · 6 run.completed.
    """
    from tests.unit.core.runs import RunLog

    key = sha256_hex(jcs(REQUEST))
    log = RunLog(run_id)
    log.add("run.started", {}, node="start")
    log.add("agent.invocation.started", {"request": dict(REQUEST), "cacheKey": key,
                                         "recipe": "openwop-semantic-request-v2"}, node=node, cause=0)
    log.add("agent.invocation.completed", {"cacheKey": key, "envelope": dict(ENVELOPE)}, node=node, cause=1)
    log.add("agent.toolCalled", {"callId": f"{run_id}:call-1", "tool": "search", "args": dict(TOOL_ARGS)},
            node=node, cause=2)
    log.add("agent.toolReturned", {"callId": f"{run_id}:call-1", "result": copy.deepcopy(TOOL_RESULT)},
            node=node, cause=3)
    log.add("variable.changed", {"name": "found", "value": 3}, node=node, cause=4)
    log.add("run.completed", {}, node="end", cause=5)
    return log.docs


def interleave(run: list[dict[str, Any]], order: list[int]) -> list[dict[str, Any]]:
    """The same events laid out in ``order`` (old sequences), renumbered 0..N; ids stay as they are."""
    out = []
    for new_seq, old_seq in enumerate(order):
        doc = copy.deepcopy(run[old_seq])
        doc["sequence"] = new_seq
        out.append(doc)
    return out
