"""Realistic multi-agent runs as RunEventDoc lists, for any test that needs one.

Stable API (other suites import it; extend, never change what exists):

* :func:`realistic_run` — the parent run of a planner that dispatches workers.
* :func:`child_runs` — the child runs of that parent (keyed by childRunId).
* :func:`event_id` / :func:`child_run_id` — the ids the builders use, so tests can
  write expected causation chains by hand.
* :class:`RunLog` — the builder itself, for small hand-made runs.

The story (both modes): a planner decides ``worker-a`` and ``worker-b`` with an
output mapping for A only (``{"result": "parentResult"}``); A's child run completes
and its result is harvested into ``parentResult``; B's dispatch fails (no child
run). A second decision names ``worker-c`` (flat mapping ``{"summary": "cSummary"}``);
C's child run is cancelled, so nothing is harvested. The run then completes.

``mode="check"``: the host emits a ``core.workflowChain.event`` per transition
(and ``node.dispatched`` for the children it created). ``mode="derive"``: the host
emits only ``runOrchestrator.decided``, ``node.dispatched`` and the children's
``run.*``. Every doc has eventId, runId, type, payload, timestamp, sequence and
nodeId; ``causationId`` is present when the event has a cause and omitted otherwise
(the envelope forbids null). Timestamps are fixed strings; eventIds are
``"<runId>:<seq:04d>"``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BINDINGS", "RunLog", "child_run_id", "child_runs", "event_id", "realistic_run"]

BINDINGS = {"engineVersion": "1.4.0", "modeVersion": "m1", "configVersion": "c7", "policyVersion": "p2"}

_T0 = "2025-01-15T10:00:{:02d}.000Z"


def event_id(run_id: str, sequence: int) -> str:
    """eventId of the event at ``sequence`` in a run built here."""
    return f"{run_id}:{sequence:04d}"


def child_run_id(run_id: str, worker_letter: str) -> str:
    """childRunId of worker ``a`` / ``c`` dispatched by run ``run_id``."""
    return f"{run_id}.child-{worker_letter}"


class RunLog:
    """Appends RunEventDocs with contiguous sequences; use it to write small hand-made runs."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.docs: list[dict[str, Any]] = []

    def add(self, type_: str, payload: Any, *, node: str = "n", cause: int | None = None) -> int:
        """Append one doc; ``cause`` is the sequence of its cause. Returns the new doc's sequence."""
        seq = len(self.docs)
        doc: dict[str, Any] = {
            "eventId": event_id(self.run_id, seq),
            "runId": self.run_id,
            "type": type_,
            "payload": payload,
            "timestamp": _T0.format(seq),
            "sequence": seq,
            "nodeId": node,
        }
        if cause is not None:
            doc["causationId"] = event_id(self.run_id, cause)
        self.docs.append(doc)
        return seq

    def chain(self, phase: str, worker: str, cause: int | None, **extra: Any) -> int:
        """Append a ``core.workflowChain.event`` of this run (extra payload fields as keywords)."""
        payload = {"phase": phase, "workerId": worker, "parentRunId": self.run_id, **extra}
        return self.add("core.workflowChain.event", payload, node="dispatch", cause=cause)

    def id(self, sequence: int) -> str:
        return event_id(self.run_id, sequence)


def realistic_run(run_id: str = "run-1", mode: str = "check") -> list[dict[str, Any]]:
    """The parent run described in the module docstring, sequences 0..N contiguous.

    Check mode, by sequence: 0 run.started · 1 variable.changed goal · 2 decided(A,B) ·
    3 provider.usage · 4 began A · 5 succeeded A · 6 node.dispatched A · 7 began B ·
    8 dispatch.failed B · 9 channel.written · 10 child.completed A · 11 output.harvested A ·
    12 variable.changed parentResult · 13 decided(C) · 14 began C · 15 succeeded C ·
    16 node.dispatched C · 17 child.cancelled C · 18 channel.written · 19 run.completed.

    Derive mode: 0 run.started · 1 variable.changed goal · 2 decided(A,B) · 3 provider.usage ·
    4 node.dispatched A · 5 node.dispatched B (childStatus dispatch_failed) · 6 channel.written ·
    7 variable.changed parentResult · 8 decided(C) · 9 node.dispatched C · 10 channel.written ·
    11 run.completed.
    """
    if mode not in ("check", "derive"):
        raise ValueError(f"mode must be 'check' or 'derive', not {mode!r}")
    log = RunLog(run_id)
    a, c = child_run_id(run_id, "a"), child_run_id(run_id, "c")
    log.add("run.started", {"bindings": dict(BINDINGS)}, node="start")
    log.add("variable.changed", {"name": "goal", "value": "summarise Q4 incidents"}, node="start")
    d1 = log.add(
        "runOrchestrator.decided",
        {
            "agentId": "agent.planner",
            "decision": {
                "kind": "next-worker",
                "nextWorkerIds": ["worker-a", "worker-b"],
                "outputMapping": {"worker-a": {"result": "parentResult"}},
            },
            "iteration": 1,
        },
        node="planner",
        cause=1,
    )
    log.add(
        "provider.usage",
        {"provider": "anthropic", "model": "claude-x", "inputTokens": 812, "outputTokens": 95},
        node="planner",
    )
    if mode == "check":
        began_a = log.chain("dispatch.began", "worker-a", d1)
        ok_a = log.chain("dispatch.succeeded", "worker-a", began_a, childRunId=a)
        log.add("node.dispatched", {"childRunId": a, "childWorkflowId": "worker-a", "childStatus": "running"},
                node="dispatch", cause=ok_a)
        began_b = log.chain("dispatch.began", "worker-b", d1)
        log.chain("dispatch.failed", "worker-b", began_b,
                  error={"code": "worker_unavailable", "message": "worker-b has no capacity"})
        log.add("channel.written", {"channel": "progress", "value": "worker-b dispatch failed"}, node="dispatch")
        done_a = log.chain("child.completed", "worker-a", ok_a, childRunId=a)
        harvest_a = log.chain("output.harvested", "worker-a", done_a, childRunId=a, harvestedKeys=["parentResult"])
        log.add("variable.changed", {"name": "parentResult", "value": {"incidents": 3, "worst": "INC-42"}},
                node="dispatch", cause=harvest_a)
    else:
        log.add("node.dispatched", {"childRunId": a, "childWorkflowId": "worker-a", "childStatus": "running"},
                node="dispatch", cause=d1)
        log.add("node.dispatched",
                {"childRunId": child_run_id(run_id, "b"), "childWorkflowId": "worker-b", "childStatus": "dispatch_failed"},
                node="dispatch", cause=d1)
        log.add("channel.written", {"channel": "progress", "value": "worker-b dispatch failed"}, node="dispatch")
        log.add("variable.changed", {"name": "parentResult", "value": {"incidents": 3, "worst": "INC-42"}},
                node="dispatch")
    d2 = log.add(
        "runOrchestrator.decided",
        {
            "agentId": "agent.planner",
            "decision": {"kind": "next-worker", "nextWorkerIds": ["worker-c"], "outputMapping": {"summary": "cSummary"}},
            "iteration": 2,
        },
        node="planner",
    )
    if mode == "check":
        began_c = log.chain("dispatch.began", "worker-c", d2)
        ok_c = log.chain("dispatch.succeeded", "worker-c", began_c, childRunId=c)
        log.add("node.dispatched", {"childRunId": c, "childWorkflowId": "worker-c", "childStatus": "running"},
                node="dispatch", cause=ok_c)
        log.chain("child.cancelled", "worker-c", ok_c, childRunId=c,
                  error={"code": "cancelled", "message": "operator cancelled worker-c"})
    else:
        log.add("node.dispatched", {"childRunId": c, "childWorkflowId": "worker-c", "childStatus": "running"},
                node="dispatch", cause=d2)
    log.add("channel.written", {"channel": "progress", "value": "done"}, node="end")
    log.add("run.completed", {"status": "completed"}, node="end")
    return log.docs


def child_runs(run_id: str = "run-1") -> dict[str, list[dict[str, Any]]]:
    """Child runs of :func:`realistic_run` (same in both modes): A completes, C is cancelled; B never ran."""
    out: dict[str, list[dict[str, Any]]] = {}
    a = RunLog(child_run_id(run_id, "a"))
    a.add("run.started", {"bindings": dict(BINDINGS)}, node="start")
    a.add("variable.changed", {"name": "result", "value": {"incidents": 3, "worst": "INC-42"}}, node="work")
    a.add("run.completed", {"status": "completed", "outputs": {"result": {"incidents": 3, "worst": "INC-42"}}},
          node="end")
    out[a.run_id] = a.docs
    c = RunLog(child_run_id(run_id, "c"))
    c.add("run.started", {"bindings": dict(BINDINGS)}, node="start")
    c.add("run.cancelled", {"status": "cancelled", "error": {"code": "cancelled", "message": "operator cancelled"}},
          node="end")
    out[c.run_id] = c.docs
    return out
