"""CrewAI, LlamaIndex AgentWorkflow, smolagents, Strands and AutoGen AgentChat, recorded, mapped to runs and child runs.

Each fixture (``tests/otel_corpus/<framework>.<instrumentation>.pb.gz``, ``python -m tests.otel_corpus.record
--frameworks``) is what a real program of that framework exported while it ran against a scripted OpenAI-compatible
server (:mod:`tests.otel_corpus.script_frameworks`): a supervisor delegating a search to a researcher (CrewAI's
hierarchical crew, smolagents' managed agent), or triage looking an order up and handing off to the refund
specialist (LlamaIndex, Strands' ``Swarm``, AutoGen's ``Swarm``). Expectations come from that script and from what
each program does, never from the mapper. No framework is needed here.

The ``check_*`` functions take the runs as a reader sees them, so ``tests/integration/otel/
test_frameworks_envs_live.py`` asserts the same of the runs a worker commits when the programs export to it live.
"""

from __future__ import annotations

import copy
import json

import pytest

from agentlog.core.fold import fold_all
from agentlog.core.otel_read import read_span
from agentlog.schemas.cachekey import cache_key
from tests.otel_corpus import script as s
from tests.otel_corpus import script_frameworks as fw
from tests.unit.core.test_otel_corpus import _mapped_call, check_log, mapped, of, spans_of

CASES = list(fw.CASES)
IDS = [f"{f}-{i}" for f, i in CASES]
#: What the first user message says, as each story's agents receive it (inside framework text at times).
ASKED = {"crewai": fw.CREW_TASK, "smolagents": fw.CREW_TASK}
#: The tool each program runs: (the agent running it, name, arguments, the result as its framework records it).
#: Strands returns tool content blocks; LlamaIndex's span records its whole ToolOutput (``raw_output`` is the
#: function's return value); AutoGen's own execute_tool span records no result.
TOOL = {
    "crewai": (s.RESEARCHER, s.SEARCH_TOOL, s.SEARCH_ARGS, s.SEARCH_RESULT),
    "smolagents": (s.RESEARCHER, s.SEARCH_TOOL, s.SEARCH_ARGS, s.SEARCH_RESULT),
    "llama_index": (s.TRIAGE, s.LOOKUP_TOOL, s.LOOKUP_ARGS, s.LOOKUP_RESULT),
    "strands": (s.TRIAGE, s.LOOKUP_TOOL, s.LOOKUP_ARGS, [{"text": s.LOOKUP_RESULT}]),
    "autogen": (s.TRIAGE, s.LOOKUP_TOOL, s.LOOKUP_ARGS, s.LOOKUP_RESULT),
}


def framework_runs(runs: dict[str, list[dict]], framework: str) -> tuple[str, str]:
    """The root run and the child run (the runs that start with run.started); every run checked as a log."""
    for events in runs.values():
        check_log(events)
    started = {run for run, events in runs.items() if events[0]["type"] == "run.started"}
    assert len(started) == 2, sorted(started)
    _, worker = fw.AGENTS[framework]
    (child,) = [r for r in started if runs[r][0]["payload"]["agent"] == worker and "parentRunId" in
                runs[r][0]["payload"]]
    (root,) = started - {child}
    # Besides them only AutoGen's create_agent spans (one per agent, each a trace of its own), kept opaque.
    others = [[d["type"] for d in events] for run, events in runs.items() if run not in started]
    assert others == ([["log.appended"]] * 2 if framework == "autogen" else []), others
    return root, child


def calls_of(framework: str, run: str, root: str) -> list[tuple[int, tuple]]:
    """(index, call) of the script's model calls the run's agent makes."""
    source, worker = fw.AGENTS[framework]
    agent = source if run == root else worker
    return [(i, c) for i, c in enumerate(fw.CALLS[framework]) if c[0] == agent]


def check_runs_and_the_handoff(framework: str, runs: dict[str, list[dict]], root: str, child: str) -> None:
    source, worker = fw.AGENTS[framework]
    for run in (root, child):  # every run whole: started first, completed last
        assert runs[run][0]["type"] == "run.started" and runs[run][-1]["type"] == "run.completed"
        assert runs[run][0]["payload"]["source"] == "opentelemetry"
    assert "parentRunId" not in runs[root][0]["payload"]
    assert runs[child][0]["payload"] == {"bindings": {}, "agent": worker, "source": "opentelemetry",
                                         "parentRunId": root}
    assert child.startswith(f"{root}/{worker}/")
    assert of(runs[root], "runOrchestrator.decided") == [
        {"agentId": source, "decision": {"nextWorkerIds": [worker]}}]
    chain = of(runs[root], "core.workflowChain.event")
    assert [p["phase"] for p in chain] == ["dispatch.began", "dispatch.succeeded", "child.completed"]
    assert {p.get("childRunId") for p in chain} == {None, child}
    assert {(p["workerId"], p["parentRunId"]) for p in chain} == {(worker, root)}
    state, outputs = fold_all(runs[root])  # the fold reads the parent's chain as a legal handoff
    assert not state["flags"]
    assert [o["phase"] for o in outputs if o["kind"] == "transition"] == [
        "dispatch.began", "dispatch.succeeded", "child.completed"]
    assert not of(runs[child], "runOrchestrator.decided")


def check_llm_calls(framework: str, runs: dict[str, list[dict]], root: str, child: str) -> None:
    """One call per scripted model call, in the run of the agent that made it (no call that was no call), with its
    content, a semantic cache key, and the scripted tokens as usage."""
    asked = ASKED.get(framework, s.AGENTS_USER)
    for run in (root, child):
        calls = calls_of(framework, run, root)
        started = of(runs[run], "agent.invocation.started")
        completed = of(runs[run], "agent.invocation.completed")
        usage = of(runs[run], "provider.usage")
        assert len(started) == len(completed) == len(usage) == len(calls), (run, len(started), len(calls))
        for (i, (agent, kind, tokens_in, tokens_out)), start, done, used in zip(
                calls, started, completed, usage, strict=True):
            assert (used["inputTokens"], used["outputTokens"], used["totalTokens"]) == (
                tokens_in, tokens_out, tokens_in + tokens_out)
            assert used["model"] == fw.model(agent)
            assert done["usage"] == {"inputTokens": tokens_in, "outputTokens": tokens_out}
            assert start["recipe"] == "openwop-semantic-request-v2"
            assert start["cacheKey"] == cache_key(start["request"]) == done["cacheKey"]
            assert start["request"]["model"] == fw.model(agent)
            texts = [p["content"] for m in start["request"]["messages"] for p in m["parts"]
                     if isinstance(p.get("content"), str)]
            assert any(asked in t for t in texts), texts
            parts = [p for m in done["envelope"] for p in m["parts"]]
            if kind == "text" and framework != "smolagents":
                answer = {s.RESEARCHER: s.RESEARCHER_ANSWER, s.SUPERVISOR: s.SUPERVISOR_ANSWER,
                          s.SPECIALIST: s.SPECIALIST_ANSWER, s.TRIAGE: fw.STRANDS_AFTER_HANDOFF}[agent]
                assert [(p["type"], p["content"].strip()) for p in parts] == [("text", answer)]
            else:
                name = {"tool_call": s.SEARCH_TOOL if agent == s.RESEARCHER else s.LOOKUP_TOOL,
                        "text": fw.FINAL_ANSWER_TOOL}.get(kind, fw.HANDOFF_TOOL[framework])
                assert [(p["type"], p["name"], p["id"]) for p in parts] == [("tool_call", name, f"call_{i}")]
        assert len({p["cacheKey"] for p in started}) == len(calls)  # each request is the conversation so far
        assert not of(runs[run], "envelope.refusal")
    if framework in ("llama_index", "strands", "autogen"):
        # The agent's instructions lead its requests (Strands exports them apart: gen_ai.system_instructions).
        for run, instructions in ((root, s.TRIAGE_INSTRUCTIONS), (child, s.SPECIALIST_INSTRUCTIONS)):
            first = of(runs[run], "agent.invocation.started")[0]["request"]["messages"][0]
            assert first["parts"][0]["content"] == instructions


def check_tool_pairs(framework: str, instrumentation: str, runs: dict[str, list[dict]], root: str,
                     child: str) -> None:
    """The tool as a call and its return, with the model's call id; the handoff or delegation is no tool call."""
    agent, tool, args, result = TOOL[framework]
    if (framework, instrumentation) == ("autogen", "genai"):
        result = None
    runs_of = {fw.AGENTS[framework][0]: root, fw.AGENTS[framework][1]: child}
    call_id = next(f"call_{i}" for i, c in enumerate(fw.CALLS[framework]) if c[1] == "tool_call")
    want = {root: [], child: []}
    want[runs_of[agent]].append((call_id, tool, args, result))
    if framework == "smolagents":  # each agent answers by calling final_answer
        for i, (who, kind, *_) in enumerate(fw.CALLS[framework]):
            if kind == "text":
                text = s.RESEARCHER_ANSWER if who == s.RESEARCHER else s.SUPERVISOR_ANSWER
                want[runs_of[who]].append((f"call_{i}", fw.FINAL_ANSWER_TOOL, {"answer": text}, text))
    for run in (root, child):
        called, returned = of(runs[run], "agent.toolCalled"), of(runs[run], "agent.toolReturned")
        if framework == "llama_index":
            returned = [{**p, "result": p["result"]["raw_output"]} for p in returned]
        assert called == [{"callId": c, "tool": t, "args": a} for c, t, a, _ in want[run]]
        assert returned == [{"callId": c, "result": r} for c, _, _, r in want[run]]


@pytest.mark.parametrize("framework,instrumentation", CASES, ids=IDS)
def test_the_receiving_agent_is_a_child_run_with_the_handoff_chain(framework, instrumentation):
    runs = mapped(spans_of(framework, instrumentation))
    check_runs_and_the_handoff(framework, runs, *framework_runs(runs, framework))


@pytest.mark.parametrize("framework,instrumentation", CASES, ids=IDS)
def test_llm_calls_with_content_cache_keys_and_usage(framework, instrumentation):
    runs = mapped(spans_of(framework, instrumentation))
    check_llm_calls(framework, runs, *framework_runs(runs, framework))


@pytest.mark.parametrize("framework,instrumentation", CASES, ids=IDS)
def test_tool_call_and_return_pairs(framework, instrumentation):
    runs = mapped(spans_of(framework, instrumentation))
    check_tool_pairs(framework, instrumentation, runs, *framework_runs(runs, framework))


@pytest.mark.parametrize("framework,instrumentation", CASES, ids=IDS)
def test_arrival_order_does_not_matter(framework, instrumentation):
    spans = spans_of(framework, instrumentation)
    assert mapped(list(reversed(spans))) == mapped(spans)


def test_llamaindex_spans_marked_llm_that_call_no_model_are_no_calls():
    """LlamaIndex's OpenInference spans mark _prepare_chat_with_tools and the wrapper around a streamed call LLM too:
    three model calls, nine LLM spans."""
    spans = spans_of("llama_index", "openinference")
    assert sum(sp["attributes"].get("openinference.span.kind") == "LLM" for sp in spans) == 3 * len(
        fw.CALLS["llama_index"])
    runs = mapped(spans)
    assert sum(len(of(e, "agent.invocation.started")) for e in runs.values()) == len(fw.CALLS["llama_index"])


def test_llamaindex_the_agent_that_hands_off_plans_the_handoff():
    """No LlamaIndex span is an agent's: the workflow's steps name the agent at work in the events they receive
    (``current_agent_name``), and the step before the handoff names triage."""
    runs = mapped(spans_of("llama_index", "openinference"))
    root, child = framework_runs(runs, "llama_index")
    assert [p["agentId"] for p in of(runs[root], "runOrchestrator.decided")] == [s.TRIAGE]
    assert {p["workerId"] for p in of(runs[root], "core.workflowChain.event")} == {s.SPECIALIST}


def test_llamaindex_steps_that_name_no_agent_leave_the_handoff_to_the_workflow():
    """Where no step records the event it receives, the handoff is the workflow's, as its root span says."""
    spans = spans_of("llama_index", "openinference")
    for sp in spans:
        if sp["attributes"].get("openinference.span.kind") == "CHAIN":
            sp["attributes"].pop("input.value", None)
    runs = mapped(spans)
    root, _ = framework_runs(runs, "llama_index")
    (root_span,) = [sp for sp in spans if not sp.get("parentSpanId")]
    assert [p["agentId"] for p in of(runs[root], "runOrchestrator.decided")] == [root_span["name"]]


@pytest.mark.parametrize("framework,instrumentation", CASES, ids=IDS)
def test_a_refusal_is_an_envelope_refusal(framework, instrumentation):
    span = next(sp for sp in spans_of(framework, instrumentation)
                if sp["attributes"].get("gen_ai.operation.name") == "chat"
                or (sp["attributes"].get("openinference.span.kind") == "LLM"
                    and any(k.startswith("llm.output_messages.") for k in sp["attributes"])))
    refused = copy.deepcopy(span)
    if instrumentation == "genai":
        refused["attributes"]["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [
            {"type": "refusal", "content": "I can't help with that."}], "finish_reason": "stop"}])
        want = {"reason": "refusal", "refusalText": "I can't help with that."}
    else:
        refused["attributes"]["llm.finish_reason"] = "content_filter"
        refused["attributes"].pop("gen_ai.response.finish_reasons", None)
        want = {"reason": "content_filter"}
    got = _mapped_call(refused)
    assert "agent.invocation.completed" not in got
    assert got["envelope.refusal"] == {"cacheKey": got["agent.invocation.started"]["cacheKey"], **want}


# --- the proposed GenAI handoff shapes, on Strands' own spans -------------------------------------------------------

def _strands_with_handoff(**attributes: object) -> dict[str, list[dict]]:
    """Strands' recorded trace with its handoff tool span rewritten as another framework would send it."""
    spans = spans_of("strands", "genai")
    span = next(sp for sp in spans if sp["attributes"].get("gen_ai.tool.name") == fw.STRANDS_HANDOFF_TOOL)
    span["events"] = []
    for key in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result"):
        span["attributes"].pop(key)
    span["attributes"].update(attributes)
    span["name"] = f"execute_tool {span['attributes']['gen_ai.tool.name']}"
    return mapped(spans)


@pytest.mark.parametrize("attributes", [
    {"gen_ai.tool.name": f"transfer_to_{s.SPECIALIST}"},
    {"gen_ai.tool.name": "route_request", "gen_ai.agent.handoff.source.name": s.TRIAGE,
     "gen_ai.agent.handoff.target.name": s.SPECIALIST},
], ids=["transfer_to_agent-tool", "handoff-attributes"])
def test_a_framework_sending_the_proposed_handoff_shape_needs_no_release(attributes):
    runs = _strands_with_handoff(**attributes)
    root, child = framework_runs(runs, "strands")
    check_runs_and_the_handoff("strands", runs, root, child)


# --- AutoGen with and without a span around the team's run ---------------------------------------------------------

def test_autogen_under_openinference_needs_no_span_around_the_team():
    """The program adds only the instrumentor lines: its trace's root is the instrumentor's own span of the team."""
    spans = spans_of("autogen", "openinference")
    assert fw.AUTOGEN_ROOT_SPAN not in {sp["name"] for sp in spans}
    runs = mapped(spans)
    root, child = framework_runs(runs, "autogen")
    check_runs_and_the_handoff("autogen", runs, root, child)


@pytest.mark.parametrize("program,instrumentation,framework", fw.SPANNED_CASES)
def test_a_program_opening_the_tracing_guides_span_arrives_the_same(program, instrumentation, framework):
    """AutoGen's tracing guide opens a span around the team's run; under OpenInference the runs are the same."""
    spans = spans_of(program, instrumentation)
    assert fw.AUTOGEN_ROOT_SPAN in {sp["name"] for sp in spans if not sp.get("parentSpanId")}
    runs = mapped(spans)
    root, child = framework_runs(runs, framework)
    check_runs_and_the_handoff(framework, runs, root, child)
    check_llm_calls(framework, runs, root, child)
    check_tool_pairs(framework, instrumentation, runs, root, child)


@pytest.mark.parametrize("value,agent", [
    ('{"ctx": "<Context>", "ev": "AgentSetup(input=[2 items], current_agent_name=\'triage\')"}', "triage"),
    ('{"ev": "AgentOutput(response=x, current_agent_name=\\"refund specialist\\")"}', "refund specialist"),
    ("AgentInput(input=[], current_agent_name='triage')", "triage"),
    ('{"init_state": "current_agent_name: str"}', None),
], ids=["repr-in-json", "escaped-double-quotes", "repr", "a-schema-not-an-event"])
def test_a_workflow_step_names_the_agent_its_event_names(value, agent):
    span = {"traceId": "t", "spanId": "s", "parentSpanId": "p", "name": "AgentWorkflow.run_agent_step",
            "startNs": "1", "endNs": "2", "attributes": {"openinference.span.kind": "CHAIN", "input.value": value}}
    assert read_span(span).agent == agent
