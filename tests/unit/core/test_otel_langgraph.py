"""Every LangGraph multi-agent shape, under OpenLLMetry and OpenInference, arrives as the handoffs it is.

The programs (``tests/otel_corpus/record.py``, scripted in :data:`tests.otel_corpus.script.LANGGRAPH_SHAPES`)
hand control from agent to agent each in one of LangGraph's ways: a conditional edge to a compiled subgraph and to
a ``create_react_agent`` node, ``Command(graph=Command.PARENT, goto=…)`` from inside a subgraph,
``langgraph-supervisor``'s handoff tools, ``langgraph-swarm``'s, a ``Send`` fan-out to concurrent workers, and node
functions invoking compiled graphs (one calling a model, an agent; one calling none, no agent).
What each program does, below, is written from the program: which agent hands control to which (:data:`HANDOFFS`)
and which tool calls run as tools (:data:`RAN`); the model calls, tokens and tool arguments come from the script.
``Command(goto=…)`` is the corpus's ``langgraph`` program (``test_otel_corpus.py``).

:func:`check_shape` takes the runs as a reader sees them, so ``tests/integration/otel/test_frameworks_live.py``
asserts the same of the runs a real worker commits.
"""

from __future__ import annotations

from collections import Counter

import pytest

from agentlog.core.fold import fold_all
from agentlog.schemas.cachekey import cache_key
from tests.otel_corpus import script as s
from tests.unit.core.test_otel_corpus import check_log, mapped, of, spans_of

CASES = [(p, i) for p in s.LANGGRAPH_SHAPES for i in s.INSTRUMENTATIONS]
#: program → the handoffs it makes, in order: (the node handing control on, the agent receiving it). Each
#: receiving agent runs as a child run; every other agent and node runs in the thread's run.
HANDOFFS = {
    "lg_routed": [(s.SUPERVISOR, s.RESEARCHER), (s.SUPERVISOR, s.WRITER)],  # route() reads the transfer call
    "lg_parent": [(s.RESEARCHER, s.WRITER)],  # the researcher's hand_off node: Command.PARENT
    "lg_supervisor": [(s.SUPERVISOR, s.RESEARCHER)],  # its transfer_to_researcher tool; back to the supervisor
    "lg_swarm": [(s.RESEARCHER, s.WRITER)],  # create_handoff_tool(agent_name="writer")
    "lg_send": [(s.PLANNER, s.WORKER), (s.PLANNER, s.WORKER)],  # one Send per topic
    # The researcher's function invokes a graph calling a model: an agent. The formatter's invokes a graph calling
    # none: a node of the thread's run.
    "lg_invoked": [(s.SUPERVISOR, s.RESEARCHER)],
}
#: program → the tools that run as tools (a tool node calls them): the search tool everywhere, the handoff tools of
#: langgraph-supervisor and langgraph-swarm. The routed program's graph routes on its transfer calls and the parent
#: program's hand_off node answers its own: the model asked for them, nothing ran them.
RAN = {"lg_routed": {s.SEARCH_TOOL}, "lg_parent": {s.SEARCH_TOOL}, "lg_supervisor": {s.SEARCH_TOOL, s.TO_RESEARCHER},
       "lg_swarm": {s.SEARCH_TOOL, s.TO_WRITER}, "lg_send": {s.SEARCH_TOOL}, "lg_invoked": {s.SEARCH_TOOL}}


def shape_runs(runs: dict[str, list[dict]], program: str) -> tuple[str, list[str]]:
    """The thread's run and its child runs in the order they started; every run checked as a log."""
    for events in runs.values():
        check_log(events)
    thread = s.LANGGRAPH_SHAPES[program][0]
    started = {run for run, events in runs.items() if events[0]["type"] == "run.started"}
    children = sorted(started - {thread}, key=lambda run: runs[run][0]["timestamp"])
    assert thread in started, sorted(started)
    # Besides them only OpenLLMetry's create_agent definition spans, each a trace (a run) of one log.appended.
    others = [[d["type"] for d in events] for run, events in runs.items() if run not in started]
    assert all(types == ["log.appended"] for types in others), others
    return thread, children


def check_shape(program: str, instrumentation: str, runs: dict[str, list[dict]]) -> None:
    thread, children = shape_runs(runs, program)
    check_children_and_handoffs(program, runs, thread, children)
    check_llm_calls(program, runs, thread, children)
    check_tools(program, runs, thread, children)


def check_children_and_handoffs(program: str, runs: dict[str, list[dict]], thread: str, children: list[str]) -> None:
    handoffs = HANDOFFS[program]
    assert [of(runs[c], "run.started")[0]["agent"] for c in children] == [to for _, to in handoffs]
    for child, (_, to) in zip(children, handoffs, strict=True):
        assert child.startswith(f"{thread}/{to}/")
        assert of(runs[child], "run.started")[0]["parentRunId"] == thread
    for run in (thread, *children):
        assert runs[run][0]["type"] == "run.started" and runs[run][-1]["type"] == "run.completed"
        # A handoff is no failure, though LangGraph raises ParentCommand through the spans of Command.PARENT.
        assert not [d for d in runs[run] if d["type"] in ("node.failed", "run.failed")]
    parent = runs[thread]
    assert of(parent, "runOrchestrator.decided") == [
        {"agentId": by, "decision": {"nextWorkerIds": [to]}} for by, to in handoffs]
    # Per child, its chain in order, each transition caused by the one before it (the first by the decision).
    by_id = {d["eventId"]: d for d in parent}
    for child, (_, to) in zip(children, handoffs, strict=True):
        completed = next(d for d in parent if d["type"] == "core.workflowChain.event"
                         and d["payload"]["phase"] == "child.completed" and d["payload"]["childRunId"] == child)
        chain = [completed]
        while chain[-1]["type"] != "runOrchestrator.decided":
            chain.append(by_id[chain[-1]["causationId"]])
        assert [d["payload"].get("phase") for d in reversed(chain)] == [
            None, "dispatch.began", "dispatch.succeeded", "child.completed"]
        assert chain[1]["payload"]["childRunId"] == child  # dispatch.succeeded
        assert {d["payload"].get("workerId") for d in chain[:3]} == {to}
    state, outputs = fold_all(parent)
    assert not state["flags"]
    assert Counter(o["phase"] for o in outputs if o["kind"] == "transition") == Counter(
        {"dispatch.began": len(children), "dispatch.succeeded": len(children), "child.completed": len(children)})


def _calls_by_run(program: str, thread: str, children: list[str],
                  runs: dict[str, list[dict]]) -> dict[str, list[tuple[int, tuple]]]:
    """Run → the script's model calls (index, call) made in it: a receiving agent's in its child run (concurrent
    workers of one agent: by the topic the child searched), every other agent's in the thread's run."""
    calls = s.LANGGRAPH_SHAPES[program][1]
    receiving = {to for _, to in HANDOFFS[program]}
    out: dict[str, list[tuple[int, tuple]]] = {thread: [(i, c) for i, c in enumerate(calls) if c[0] not in receiving]}
    for child in children:
        agent = of(runs[child], "run.started")[0]["agent"]
        topics = {p["args"].get("query") for p in of(runs[child], "agent.toolCalled")}
        out[child] = [(i, c) for i, c in enumerate(calls) if c[0] == agent and (c[4] is None or c[4] in topics)]
    assert sorted(i for made in out.values() for i, _ in made) == list(range(len(calls)))
    return out


def check_llm_calls(program: str, runs: dict[str, list[dict]], thread: str, children: list[str]) -> None:
    for run, calls in _calls_by_run(program, thread, children, runs).items():
        started = of(runs[run], "agent.invocation.started")
        completed = of(runs[run], "agent.invocation.completed")
        usage = of(runs[run], "provider.usage")
        assert len(started) == len(completed) == len(usage) == len(calls)
        for (i, (_, reply, tokens_in, tokens_out, when)), start, done, used in zip(
                calls, started, completed, usage, strict=True):
            assert (used["inputTokens"], used["outputTokens"], used["totalTokens"]) == (
                tokens_in, tokens_out, tokens_in + tokens_out)
            assert done["usage"] == {"inputTokens": tokens_in, "outputTokens": tokens_out}
            assert start["recipe"] == "openwop-semantic-request-v2"
            assert start["cacheKey"] == cache_key(start["request"]) == done["cacheKey"]
            texts = [str(p.get("content")) for m in start["request"]["messages"] for p in m["parts"]]
            assert (f"Search: {when}" if when else s.GRAPH_USER) in texts
            parts = [p for m in done["envelope"] for p in m["parts"]]
            if "text" in reply:
                assert [(p["type"], p["content"]) for p in parts] == [("text", reply["text"])]
            else:
                assert [(p["type"], p["name"], p["id"], p["arguments"]) for p in parts] == [
                    ("tool_call", reply["tool"], f"call_{i}", reply["args"])]
        assert len({p["cacheKey"] for p in started}) == len(calls)  # each request is the conversation so far
        assert not of(runs[run], "envelope.refusal")


def check_tools(program: str, runs: dict[str, list[dict]], thread: str, children: list[str]) -> None:
    results = {**s.TOPIC_RESULTS, s.SEARCH_ARGS["query"]: s.SEARCH_RESULT}
    for run, calls in _calls_by_run(program, thread, children, runs).items():
        ran = [(f"call_{i}", reply) for i, (_, reply, *_) in calls if reply.get("tool") in RAN[program]]
        assert of(runs[run], "agent.toolCalled") == [
            {"callId": call_id, "tool": reply["tool"], "args": reply["args"]} for call_id, reply in ran]
        returned = of(runs[run], "agent.toolReturned")
        assert [p["callId"] for p in returned] == [call_id for call_id, _ in ran]
        for p, (_, reply) in zip(returned, ran, strict=True):
            if reply["tool"] == s.SEARCH_TOOL:
                assert p["result"] == results[reply["args"]["query"]]


def runs_of(program: str, instrumentation: str) -> dict[str, list[dict]]:
    return mapped(spans_of(program, instrumentation))


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_each_agent_that_receives_control_is_a_child_run_with_the_handoff_chain(program, instrumentation):
    runs = runs_of(program, instrumentation)
    thread, children = shape_runs(runs, program)
    check_children_and_handoffs(program, runs, thread, children)


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_llm_calls_with_content_cache_keys_and_usage(program, instrumentation):
    runs = runs_of(program, instrumentation)
    check_llm_calls(program, runs, *shape_runs(runs, program))
    calls = s.LANGGRAPH_SHAPES[program][1]
    used = [p for events in runs.values() for p in of(events, "provider.usage")]
    assert (sum(p["inputTokens"] for p in used), sum(p["outputTokens"] for p in used)) == (
        sum(c[2] for c in calls), sum(c[3] for c in calls))


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_tool_call_and_return_pairs(program, instrumentation):
    runs = runs_of(program, instrumentation)
    check_tools(program, runs, *shape_runs(runs, program))


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_nothing_is_dropped_and_arrival_order_does_not_matter(program, instrumentation):
    spans = spans_of(program, instrumentation)
    runs = mapped(spans)
    assert mapped(list(reversed(spans))) == runs
    seen = {d["eventId"] for events in runs.values() for d in events}
    assert sum(len(e) for e in runs.values()) == len(seen)
    # Every span has an event but a goto span a handoff accounts for (its chain is the parent run's).
    assert len(seen) >= len(spans) - sum(1 for sp in spans if sp["name"].startswith("goto "))


def test_parallel_workers_run_concurrently_each_a_child_run():
    """The Send fan-out's workers overlap in time, and so do their child runs' handoffs in the parent run."""
    for instrumentation in s.INSTRUMENTATIONS:
        runs = runs_of("lg_send", instrumentation)
        thread, children = shape_runs(runs, "lg_send")
        assert len(children) == len(s.TOPICS)
        first, second = ([d["timestamp"] for d in runs[c]] for c in children)
        assert second[0] < first[-1]  # the second worker started before the first one finished
        phases = [(d["payload"]["phase"], d["payload"].get("childRunId")) for d in runs[thread]
                  if d["type"] == "core.workflowChain.event"]
        assert phases.index(("dispatch.succeeded", children[1])) < phases.index(("child.completed", children[0]))
        searched = {run: [p["args"]["query"] for p in of(runs[run], "agent.toolCalled")] for run in children}
        assert sorted(searched.values()) == sorted([t] for t in s.TOPICS)


@pytest.mark.parametrize("instrumentation", s.INSTRUMENTATIONS)
def test_a_graph_a_node_function_invokes_is_an_agent_when_it_calls_a_model(instrumentation):
    """The researcher's function invokes a graph calling a model: a child run. The formatter's invokes a graph of one
    plain node: the formatter and that node stay in the thread's run."""
    runs = runs_of("lg_invoked", instrumentation)
    thread, children = shape_runs(runs, "lg_invoked")
    assert [of(runs[c], "run.started")[0]["agent"] for c in children] == [s.RESEARCHER]
    nodes = {p.get("node") for p in of(runs[thread], "node.started")}
    assert {s.FORMATTER, "report"} <= nodes
