"""The agent graph of a run tree: who handed to whom, how often, and each agent's time, tokens and cost.

Built from what the handoff machines recorded, never from timing: the ``transitions`` of the run
and, level by level, of the child runs they name (a dispatch's ``childRunId``), and each run's own
events for its figures (first to last event time, ``provider.usage`` tokens and cost). An agent is a
``workerId`` of a dispatch (every child run dispatched to it is one of its runs); the run the graph
is drawn for is the root agent. A handoff is the dispatches from one agent to another: how many,
how many failed (the machine ended in ``failed`` or ``cancelled``), and the child runs they started.

The reads go through ``select`` (read-only SQL text in, rows out), so the console (an open store)
and ``agentlog report`` (the store, or the worker that owns it: :func:`agentlog.audit.server.answer_query`)
build the same graph. Values are ClickHouse literals: the read-only SQL endpoint binds no parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_RUNS", "AgentGraph", "AgentNode", "Handoff", "agent_graph"]

#: Rows in, as the store or the worker's SQL endpoint answers.
Select = Callable[[str], Sequence[Sequence[Any]]]

#: Runs of a tree the graph reads at most (a supervisor that dispatched thousands of times still draws one
#: node per agent, but its figures then stop at this many runs; ``truncated`` says so).
MAX_RUNS = 5000
#: Levels of child runs below the root that are followed.
MAX_DEPTH = 8
#: A dispatch whose machine ended in one of these failed.
_FAILED = frozenset({"failed", "cancelled", "dispatch_failed"})
_FAILED_PHASES = frozenset({"dispatch.failed", "child.failed", "child.cancelled"})


@dataclass(frozen=True, kw_only=True)
class AgentNode:
    """One agent: the runs it ran in the tree, those of them the store holds events of (``recorded``), and their
    figures (sums over the recorded runs)."""

    name: str
    depth: int
    runs: tuple[str, ...]
    recorded: tuple[str, ...] = ()
    root: bool = False
    events: int = 0
    duration_ms: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_cents: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Handoff:
    """The dispatches from agent ``source`` to agent ``target``."""

    source: str
    target: str
    count: int
    failed: int
    runs: tuple[str, ...] = field(default=())


@dataclass(frozen=True, kw_only=True)
class AgentGraph:
    """The agents of the tree under ``run_id`` (the root first, then by depth) and the handoffs between them."""

    run_id: str
    agents: tuple[AgentNode, ...]
    handoffs: tuple[Handoff, ...]
    truncated: bool = False


def _lit(value: Any) -> str:
    from clickhouse_connect.driver.binding import format_query_value

    return str(format_query_value(value))


def _in(ids: Iterable[str]) -> str:
    return "(" + ", ".join(_lit(i) for i in ids) + ")"


def agent_graph(select: Select, run_id: str) -> AgentGraph:
    """The agent graph of ``run_id``'s tree (module docstring).

    The root agent is named by the dispatch that started ``run_id`` when it is itself a child run, else by
    its run id.
    """
    named = select(f"SELECT worker_id FROM transitions WHERE child_run_id = {_lit(run_id)} AND worker_id != '' "
                   "LIMIT 1")
    root = str(named[0][0]) if named else run_id
    agent_of: dict[str, str] = {run_id: root}
    depth_of: dict[str, int] = {root: 0}
    order: list[str] = [root]
    runs_of: dict[str, list[str]] = {root: [run_id]}
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    level, seen, truncated = [run_id], {run_id}, False
    for depth in range(1, MAX_DEPTH + 1):
        if not level:
            break
        rows = select("SELECT parent_run_id, dispatch_id, worker_id, child_run_id, phase, to_state FROM transitions "
                      f"WHERE parent_run_id IN {_in(level)} ORDER BY parent_run_id, sequence")
        dispatches: dict[tuple[str, str], dict[str, Any]] = {}
        for parent, dispatch, worker, child, phase, to_state in rows:
            d = dispatches.setdefault((str(parent), str(dispatch)), {"worker": str(worker or "?"), "child": "",
                                                                       "failed": False})
            if child:
                d["child"] = str(child)
            d["failed"] = str(to_state) in _FAILED or str(phase) in _FAILED_PHASES
        following: list[str] = []
        for (parent, _), d in dispatches.items():
            source, target = agent_of.get(parent, parent), d["worker"]
            if target not in depth_of:
                depth_of[target] = depth
                order.append(target)
                runs_of[target] = []
            edge = edges.setdefault((source, target), {"count": 0, "failed": 0, "runs": []})
            edge["count"] += 1
            edge["failed"] += int(d["failed"])
            child = d["child"]
            if child and child not in seen:
                if len(seen) >= MAX_RUNS:
                    truncated = True
                    continue
                seen.add(child)
                agent_of[child] = target
                runs_of[target].append(child)
                edge["runs"].append(child)
                following.append(child)
        level = following
    else:
        truncated = truncated or bool(level)
    figures = {str(r[0]): r[1:] for r in select(
        "SELECT run_id, count(), dateDiff('millisecond', min(event_time), max(event_time)), "
        "sumIf(input_tokens, type = 'provider.usage'), sumIf(output_tokens, type = 'provider.usage'), "
        "sumIf(cost_cents, type = 'provider.usage') "
        f"FROM events WHERE run_id IN {_in(seen)} GROUP BY run_id")}
    agents = []
    for name in sorted(order, key=lambda n: depth_of[n]):  # stable: first seen first within a depth
        own = [figures[r] for r in runs_of[name] if r in figures]
        agents.append(AgentNode(
            name=name, depth=depth_of[name], runs=tuple(runs_of[name]), root=name == root,
            recorded=tuple(r for r in runs_of[name] if r in figures),
            events=sum(int(f[0]) for f in own), duration_ms=sum(int(f[1] or 0) for f in own),
            input_tokens=sum(int(f[2] or 0) for f in own), output_tokens=sum(int(f[3] or 0) for f in own),
            cost_cents=round(sum(float(f[4] or 0) for f in own), 4)))
    handoffs = tuple(Handoff(source=s, target=t, count=e["count"], failed=e["failed"], runs=tuple(e["runs"]))
                     for (s, t), e in edges.items())
    return AgentGraph(run_id=run_id, agents=tuple(agents), handoffs=handoffs, truncated=truncated)
