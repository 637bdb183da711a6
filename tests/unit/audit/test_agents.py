"""The agent graph of a run tree, from the transitions and the child runs' events in the store (not from timing).

On the realistic scenario (run-1 dispatches worker-a, whose child run completes; worker-b, whose dispatch
fails; worker-c, whose child run is cancelled) and on a deeper tree made here: a child run that dispatches
further, an agent dispatched twice, a handoff back to the supervisor, usage in the child runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.audit.agents import agent_graph
from agentlog.audit.report import agent_graph_svg, agents_table, render_report
from tests.unit.audit.data import committed, transitions
from tests.unit.core.runs import RunLog


def _select(store):
    return lambda sql: store.query(sql).rows


def test_the_scenario_hands_to_three_agents_once_each(loaded_store):
    graph = agent_graph(_select(loaded_store), "run-1")
    assert [(a.name, a.depth, a.runs) for a in graph.agents] == [
        ("run-1", 0, ("run-1",)), ("worker-a", 1, ("run-1.child-a",)), ("worker-b", 1, ()),
        ("worker-c", 1, ("run-1.child-c",))]
    assert {(h.source, h.target, h.count, h.failed) for h in graph.handoffs} == {
        ("run-1", "worker-a", 1, 0), ("run-1", "worker-b", 1, 1), ("run-1", "worker-c", 1, 1)}
    root, a = graph.agents[0], graph.agents[1]
    assert (root.events, root.input_tokens, root.output_tokens) == (20, 812, 95)  # provider.usage of run-1
    assert (a.events, a.duration_ms) == (3, 2000)
    assert not graph.truncated


def _dispatch(log: RunLog, worker: str, child: str, end: str, cause: int | None = None) -> None:
    began = log.chain("dispatch.began", worker, cause)
    ok = log.chain("dispatch.succeeded", worker, began, childRunId=child)
    log.chain(end, worker, ok, childRunId=child)


def _usage(log: RunLog, tokens: int, cents: float) -> None:
    log.add("provider.usage", {"provider": "anthropic", "model": "claude-x", "inputTokens": tokens,
                               "outputTokens": tokens // 10, "costCents": cents})


@pytest.fixture
def tree_store(store):
    """sup → research (twice: two child runs), research#1 → search (a grandchild), sup → writer → sup."""
    runs: dict[str, RunLog] = {name: RunLog(name) for name in ("sup", "sup.r1", "sup.r2", "sup.r1.s", "sup.w",
                                                               "sup.w.back")}
    for log in runs.values():
        log.add("run.started", {"bindings": {}})
    _usage(runs["sup"], 100, 1.0)
    _dispatch(runs["sup"], "research", "sup.r1", "child.completed")
    _dispatch(runs["sup"], "research", "sup.r2", "child.failed")
    _dispatch(runs["sup"], "writer", "sup.w", "child.completed")
    _usage(runs["sup.r1"], 40, 0.5)
    _dispatch(runs["sup.r1"], "search", "sup.r1.s", "child.completed")
    _usage(runs["sup.r2"], 60, 0.25)
    _usage(runs["sup.r1.s"], 7, 0.125)
    _dispatch(runs["sup.w"], "sup", "sup.w.back", "child.completed")  # the writer hands back to the supervisor
    records: list[dict[str, Any]] = []
    moves: list[dict[str, Any]] = []
    for i, log in enumerate(runs.values()):
        log.add("run.completed", {"status": "completed"})
        records += committed(log.docs, first_offset=100 * i)
        moves += transitions(log.docs)
    store.insert_records("committed", records)
    store.insert_records("transition", moves)
    return store


def test_a_deeper_tree_aggregates_agents_and_counts_each_handoff(tree_store):
    graph = agent_graph(_select(tree_store), "sup")
    agents = {a.name: a for a in graph.agents}
    assert [(a.name, a.depth) for a in graph.agents] == [("sup", 0), ("research", 1), ("writer", 1), ("search", 2)]
    assert agents["research"].runs == ("sup.r1", "sup.r2")
    assert (agents["research"].input_tokens, agents["research"].output_tokens) == (100, 10)
    assert agents["research"].cost_cents == 0.75
    assert agents["search"].runs == ("sup.r1.s",) and agents["search"].input_tokens == 7
    # sup.w.back is another run of the agent "sup": it belongs to the root agent, not to a new one.
    assert agents["sup"].runs == ("sup", "sup.w.back") and agents["sup"].input_tokens == 100
    assert {(h.source, h.target, h.count, h.failed) for h in graph.handoffs} == {
        ("sup", "research", 2, 1), ("sup", "writer", 1, 0), ("research", "search", 1, 0), ("writer", "sup", 1, 0)}


def test_the_graph_draws_a_box_per_agent_linking_its_child_run_and_an_arrow_per_handoff(tree_store):
    graph = agent_graph(_select(tree_store), "sup")
    svg = agent_graph_svg(graph, lambda r: f"/runs/{r}")
    assert svg.count('class="agent"') == 4 and svg.count('<g class="handoff"') == 4
    assert '<a href="/runs/sup.r1" class="agent" data-agent="research" data-runs="2"' in svg
    assert 'data-from="sup" data-to="research" data-count="2" data-failed="1"' in svg
    assert '<g class="agent" data-agent="sup"' in svg  # the root is the page itself: no link
    table = agents_table(graph, lambda r: f"/runs/{r}")
    assert '<a href="/runs/sup.r2">sup.r2</a>' in table and "research ×2 (1 failed)" in table
    page = render_report([], [], [], run_id="sup", agents=graph)
    assert "<h2>Agents</h2>" in page and "href=" not in agent_graph_svg(graph)  # a report file links nowhere


def test_a_run_without_handoffs_says_so(loaded_store):
    graph = agent_graph(_select(loaded_store), "run-llm")
    assert [a.name for a in graph.agents] == ["run-llm"] and graph.handoffs == ()
    assert "dispatched to no agent" in agent_graph_svg(graph)


def test_a_child_run_is_the_root_of_its_own_graph_under_its_agent_name(tree_store):
    graph = agent_graph(_select(tree_store), "sup.r1")
    assert [(a.name, a.runs) for a in graph.agents] == [("research", ("sup.r1",)), ("search", ("sup.r1.s",))]


def test_a_child_run_nobody_recorded_is_named_not_linked():
    from agentlog.audit.agents import AgentGraph, AgentNode, Handoff

    graph = AgentGraph(run_id="p", agents=(AgentNode(name="p", depth=0, runs=("p",), recorded=("p",), root=True),
                                           AgentNode(name="w", depth=1, runs=("p.w",))),
                       handoffs=(Handoff(source="p", target="w", count=1, failed=0, runs=("p.w",)),))
    svg = agent_graph_svg(graph, lambda r: f"/runs/{r}")
    assert "<a " not in svg and "1 run (0 recorded)" in svg
    assert "<code>p.w</code> (not recorded)" in agents_table(graph, lambda r: f"/runs/{r}")
