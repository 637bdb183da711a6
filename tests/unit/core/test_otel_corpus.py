"""The OTLP corpus (``tests/otel_corpus``): real framework runs, each instrumented two ways, mapped to runs.

Each fixture is the exact OTLP/HTTP request an exporter sent while a scripted multi-agent
program ran (``python -m tests.otel_corpus.record``). Expectations come from the script
(:mod:`tests.otel_corpus.script`: which agents, which model calls with which token counts,
which tool with which arguments), never from the mapper. No framework is needed here.

The ``check_*`` functions take the runs as a reader sees them (run id → its events in sequence
order), so ``tests/integration/otel/test_frameworks_live.py`` asserts the same of the runs a real
worker commits when the same programs export to it live.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from agentlog.core.fold import fold_all
from agentlog.core.otel import map_trace, plan_trace
from agentlog.schemas.cachekey import cache_key
from agentlog.schemas.upstream import upstream_file
from agentlog.schemas.validate import validate_doc
from agentlog.worker.otlp import decode_request, span_dicts
from tests.otel_corpus import script as s

CORPUS = Path(__file__).parents[2] / "otel_corpus"
SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
CASES = [(p, i) for p in s.PROGRAMS for i in s.INSTRUMENTATIONS] + list(s.EXTRA_CASES)
#: What each program does: (the agent handing off, the agent it hands off to, the model calls in order).
SCRIPTS = {"openai_agents": (s.TRIAGE, s.SPECIALIST, s.AGENTS_CALLS),
           "langgraph": (s.SUPERVISOR, s.RESEARCHER, s.GRAPH_CALLS),
           "adk": (s.TRIAGE, s.SPECIALIST, s.ADK_CALLS)}


def spans_of(program: str, instrumentation: str) -> list[dict]:
    body = (CORPUS / f"{program}.{instrumentation}.pb.gz").read_bytes()
    spans, refused = span_dicts(decode_request(body, "application/x-protobuf", "gzip"))
    assert refused == []
    return spans


def mapped(spans: list[dict]) -> dict[str, list[dict]]:
    """Every trace mapped as the worker would (one emission per trace); docs per run."""
    traces: dict[str, dict[str, dict]] = defaultdict(dict)
    for span in spans:
        traces[span["traceId"]][span["spanId"]] = span
    runs: dict[str, list[dict]] = defaultdict(list)
    for trace_id, pending in traces.items():
        for doc in map_trace(trace_id, pending, published={}, cursors={}).docs:
            runs[doc["runId"]].append(doc)
    return dict(runs)


def check_log(events: list[dict]) -> None:
    ids: set[str] = set()
    for i, doc in enumerate(events):
        assert doc["sequence"] == i
        if "causationId" in doc:
            assert doc["causationId"] in ids, f"{doc['type']} at {i} names a later or unknown event"
        ids.add(doc["eventId"])
        validate_doc(doc)
        VALIDATOR.validate(doc)


def of(events: list[dict], etype: str) -> list[dict]:
    return [d["payload"] for d in events if d["type"] == etype]


def program_runs(program: str, instrumentation: str) -> tuple[dict[str, list[dict]], str, str]:
    """The runs of a fixture, the root run's id and the child run's id (the runs that start with run.started)."""
    return root_and_child(mapped(spans_of(program, instrumentation)))


def root_and_child(runs: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], str, str]:
    """Every run checked as a log; the root run's id and the child run's id (the runs that start with run.started)."""
    for events in runs.values():
        check_log(events)
    started = {run for run, events in runs.items() if events[0]["type"] == "run.started"}
    assert len(started) == 2, sorted(started)
    child = next(r for r in started if any(p["phase"] == "dispatch.succeeded" and p["childRunId"] == r
                                           for events in runs.values()
                                           for p in of(events, "core.workflowChain.event")))
    (root,) = started - {child}
    return runs, root, child


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_runs_child_runs_and_the_handoff(program, instrumentation):
    check_runs_child_runs_and_the_handoff(program, instrumentation, *program_runs(program, instrumentation))


def check_runs_child_runs_and_the_handoff(program: str, instrumentation: str, runs: dict[str, list[dict]],
                                          root: str, child: str) -> None:
    source, worker, _ = SCRIPTS[program]
    if program == "langgraph":
        assert root == s.GRAPH_THREAD  # LangGraph's thread id is the run id, under either family
        assert child.startswith(f"{s.GRAPH_THREAD}/{worker}/")
    if program == "adk":
        assert root == s.ADK_SESSION  # ADK's session id is its gen_ai.conversation.id
        assert child.startswith(f"{s.ADK_SESSION}/{worker}/")  # the sub-agent transferred to
    # Every run is whole: started first, completed last.
    for run in (root, child):
        assert runs[run][0]["type"] == "run.started" and runs[run][-1]["type"] == "run.completed"
    assert of(runs[child], "run.started")[0]["agent"] == worker
    decided = of(runs[root], "runOrchestrator.decided")
    assert decided == [{"agentId": source, "decision": {"nextWorkerIds": [worker]}}]
    chain = of(runs[root], "core.workflowChain.event")
    assert [p["phase"] for p in chain] == ["dispatch.began", "dispatch.succeeded", "child.completed"]
    assert {p.get("childRunId") for p in chain} == {None, child}
    # The fold reads the parent's chain as a legal handoff.
    state, outputs = fold_all(runs[root])
    assert not state["flags"]
    assert [o["phase"] for o in outputs if o["kind"] == "transition"] == [
        "dispatch.began", "dispatch.succeeded", "child.completed"]
    # Other runs: only OpenLLMetry's LangGraph "create_agent" definition span, in a trace of its own, kept opaque.
    others = {r: [d["type"] for d in e] for r, e in runs.items() if r not in (root, child)}
    assert others == ({} if (program, instrumentation) != ("langgraph", "openllmetry")
                      else {next(iter(others)): ["log.appended"]})


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_llm_calls_with_content_cache_keys_and_usage(program, instrumentation):
    check_llm_calls_with_content_cache_keys_and_usage(program, instrumentation,
                                                      *program_runs(program, instrumentation))


def check_llm_calls_with_content_cache_keys_and_usage(program: str, instrumentation: str, runs: dict[str, list[dict]],
                                                      root: str, child: str) -> None:
    script = SCRIPTS[program][2]
    first_agent = script[0][0]
    for run, calls in ((root, [c for c in script if c[0] == first_agent]),
                       (child, [c for c in script if c[0] != first_agent])):
        started = of(runs[run], "agent.invocation.started")
        completed = of(runs[run], "agent.invocation.completed")
        usage = of(runs[run], "provider.usage")
        assert len(started) == len(completed) == len(usage) == len(calls)
        for call, start, done, used in zip(calls, started, completed, usage, strict=True):
            _, kind, tokens_in, tokens_out = call
            assert (used["inputTokens"], used["outputTokens"]) == (tokens_in, tokens_out)
            # ADK's own instrumentation exports no total; the others' is the sum.
            assert used.get("totalTokens") == (None if instrumentation == "genai" else tokens_in + tokens_out)
            assert done["usage"] == {"inputTokens": tokens_in, "outputTokens": tokens_out}
            # The request was captured: a semantic key computed from its messages.
            assert start["recipe"] == "openwop-semantic-request-v2"
            assert start["cacheKey"] == cache_key(start["request"]) == done["cacheKey"]
            texts = [p.get("content") for m in start["request"]["messages"] for p in m["parts"]]
            assert (s.GRAPH_USER if program == "langgraph" else s.AGENTS_USER) in texts
            parts = [p for m in done["envelope"] for p in m["parts"]]
            if kind == "text":
                assert parts[0]["type"] == "text" and parts[0]["content"] in (
                    s.SPECIALIST_ANSWER, s.RESEARCHER_ANSWER, s.SUPERVISOR_ANSWER)
            else:
                name = {"tool_call": s.SEARCH_TOOL if program == "langgraph" else s.LOOKUP_TOOL,
                        "handoff": s.ADK_TRANSFER_TOOL if program == "adk" else s.HANDOFF_TOOL,
                        "route": s.ROUTE_TOOL}[kind]
                assert [(p["type"], p["name"]) for p in parts] == [("tool_call", name)]
        # Keys differ per call: each request is the conversation so far.
        assert len({p["cacheKey"] for p in started}) == len(calls)
    if program == "openai_agents":
        system = of(runs[root], "agent.invocation.started")[0]["request"]["messages"][0]
        assert system == {"role": "system", "parts": [{"type": "text", "content": s.TRIAGE_INSTRUCTIONS}]}
    elif program == "adk":
        # ADK exports the system prompt apart (gen_ai.system_instructions; OpenInference: the first input
        # message): it leads the request, so the key changes with it. ADK appends its own transfer
        # instructions to the agent's.
        for run, instructions in ((root, s.TRIAGE_INSTRUCTIONS), (child, s.SPECIALIST_INSTRUCTIONS)):
            system = of(runs[run], "agent.invocation.started")[0]["request"]["messages"][0]
            assert system["role"] == "system" and system["parts"][0]["content"].startswith(instructions)
    else:
        first = of(runs[root], "agent.invocation.started")[0]["request"]["messages"]
        assert first == [{"role": "user", "parts": [{"type": "text", "content": s.GRAPH_USER}]}]
    assert not of(runs[root], "envelope.refusal") and not of(runs[child], "envelope.refusal")


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_tool_call_and_return_pairs(program, instrumentation):
    check_tool_call_and_return_pairs(program, instrumentation, *program_runs(program, instrumentation))


def check_tool_call_and_return_pairs(program: str, instrumentation: str, runs: dict[str, list[dict]], root: str,
                                     child: str) -> None:
    run = child if program == "langgraph" else root  # the researcher's tool; the triage agent's
    tool, args, result = ((s.SEARCH_TOOL, s.SEARCH_ARGS, s.SEARCH_RESULT) if program == "langgraph"
                          else (s.LOOKUP_TOOL, s.LOOKUP_ARGS, s.LOOKUP_RESULT))
    if program == "adk":
        result = {"result": result}  # ADK wraps a tool's plain return value as its function response
    called, returned = of(runs[run], "agent.toolCalled"), of(runs[run], "agent.toolReturned")
    # The call id is the one the model asked with (the scripted model numbers its calls call_<i>).
    call_id = f"call_{[c[1] for c in SCRIPTS[program][2]].index('tool_call')}"
    if (program, instrumentation) == ("adk", "openinference"):
        # OpenInference's output.value is the whole FunctionResponse the model is sent.
        result = {"id": call_id, "name": s.LOOKUP_TOOL, "response": result}
    assert called == [{"callId": call_id, "tool": tool, "args": args}]
    assert returned == [{"callId": call_id, "result": result}]
    other = child if run == root else root
    assert not of(runs[other], "agent.toolCalled")


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_nothing_is_dropped_and_arrival_order_does_not_matter(program, instrumentation):
    spans = spans_of(program, instrumentation)
    runs = mapped(spans)
    assert mapped(list(reversed(spans))) == runs
    # Every span has at least one event (an unmatched one as log.appended), so none vanishes.
    seen = {d["eventId"] for events in runs.values() for d in events}
    assert sum(len(e) for e in runs.values()) == len(seen)
    assert len(seen) >= len(spans) - sum(1 for sp in spans if sp["name"].startswith(
        ("handoff", "triage →", "goto", f"execute_tool {s.ADK_TRANSFER_TOOL}")))


# --- the other GenAI message forms, on the corpus's own spans -----------------------------------------------------

def _first_chat() -> tuple[dict, dict]:
    """The triage agent's first model call (OpenLLMetry, GenAI attributes) and what it maps to."""
    span = next(sp for sp in spans_of("openai_agents", "openllmetry")
                if sp["attributes"].get("gen_ai.operation.name") == "chat")
    return span, _mapped_call(span)


def _mapped_call(span: dict) -> dict:
    docs = map_trace(span["traceId"], {span["spanId"]: span}, published={}, cursors={}).docs
    check_log(docs)
    return {d["type"]: d["payload"] for d in docs}


def _without_messages(span: dict) -> tuple[dict, list, list]:
    span = copy.deepcopy(span)
    inputs = json.loads(span["attributes"].pop("gen_ai.input.messages"))
    outputs = json.loads(span["attributes"].pop("gen_ai.output.messages"))
    return span, inputs, outputs


def test_the_indexed_prompt_form_is_read_as_the_request():
    original, expected = _first_chat()
    span, inputs, outputs = _without_messages(original)
    for i, m in enumerate(inputs):  # OpenLLMetry's older gen_ai.prompt.N.* / gen_ai.completion.N.* attributes
        span["attributes"][f"gen_ai.prompt.{i}.role"] = m["role"]
        span["attributes"][f"gen_ai.prompt.{i}.content"] = m["parts"][0]["content"]
    (call,) = outputs[0]["parts"]
    span["attributes"].update({"gen_ai.completion.0.role": "assistant",
                               "gen_ai.completion.0.finish_reason": outputs[0]["finish_reason"],
                               "gen_ai.completion.0.tool_calls.0.id": call["id"],
                               "gen_ai.completion.0.tool_calls.0.name": call["name"],
                               "gen_ai.completion.0.tool_calls.0.arguments": json.dumps(call["arguments"])})
    got = _mapped_call(span)
    assert got["agent.invocation.started"] == expected["agent.invocation.started"]  # same request, same key
    assert got["agent.invocation.completed"]["envelope"][0]["parts"] == outputs[0]["parts"]


def test_the_operation_details_event_and_per_message_events_are_read():
    original, expected = _first_chat()
    span, inputs, outputs = _without_messages(original)
    details = copy.deepcopy(span)
    details["events"] = [{"name": "gen_ai.client.inference.operation.details", "timeNs": details["endNs"],
                          "attributes": {"gen_ai.input.messages": json.dumps(inputs),
                                         "gen_ai.output.messages": json.dumps(outputs)}}]
    assert _mapped_call(details) == expected
    per_message = copy.deepcopy(span)
    per_message["events"] = [{"name": f"gen_ai.{m['role']}.message", "timeNs": span["startNs"],
                              "attributes": {"content": m["parts"][0]["content"]}} for m in inputs]
    assert _mapped_call(per_message)["agent.invocation.started"] == expected["agent.invocation.started"]


@pytest.mark.parametrize("program,instrumentation", CASES)
def test_a_refusal_is_an_envelope_refusal(program, instrumentation):
    span = next(sp for sp in spans_of(program, instrumentation)
                if sp["attributes"].get("gen_ai.operation.name") in ("chat", "generate_content")
                or sp["attributes"].get("openinference.span.kind") == "LLM")
    refused = copy.deepcopy(span)
    if instrumentation in ("openllmetry", "genai"):
        refused["attributes"]["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [
            {"type": "refusal", "content": "I can't help with that."}], "finish_reason": "stop"}])
        want = {"reason": "refusal", "refusalText": "I can't help with that."}
    elif program == "adk":
        # Under OpenInference the model call is ADK's own call_llm span: ADK writes Gemini's finish reason.
        refused["attributes"]["gen_ai.response.finish_reasons"] = ["safety"]
        want = {"reason": "safety"}
    else:
        refused["attributes"]["llm.finish_reason"] = "content_filter"
        want = {"reason": "content_filter"}
    got = _mapped_call(refused)
    assert "agent.invocation.completed" not in got
    assert got["envelope.refusal"] == {"cacheKey": got["agent.invocation.started"]["cacheKey"], **want}


def test_a_malformed_attribute_rejects_its_span_and_keeps_the_rest():
    spans = spans_of("langgraph", "openinference") + spans_of("openai_agents", "openllmetry")
    oi_llm = next(sp for sp in spans if sp["attributes"].get("openinference.span.kind") == "LLM")
    genai_llm = next(sp for sp in spans if sp["attributes"].get("gen_ai.operation.name") == "chat")
    oi_llm["attributes"]["llm.token_count.prompt"] = "twenty"
    text = genai_llm["attributes"]["gen_ai.input.messages"]
    genai_llm["attributes"]["gen_ai.input.messages"] = text[: len(text) // 2]  # truncated JSON
    reasons = {}
    for trace_id in {oi_llm["traceId"], genai_llm["traceId"]}:
        pending = {sp["spanId"]: sp for sp in spans if sp["traceId"] == trace_id}
        plan = plan_trace(trace_id, pending, published={})
        reasons.update(plan.rejected)
        kept = [e["doc"] for events in plan.runs.values() for e in events]
        assert len({e["span"] for events in plan.runs.values() for e in events}) >= len(pending) - 3
        assert [d["payload"]["rejected"]["spanId"] for d in kept if d["payload"].get("rejected")] == list(
            plan.rejected)
    assert set(reasons) == {oi_llm["spanId"], genai_llm["spanId"]}
    assert "llm.token_count.prompt" in reasons[oi_llm["spanId"]]
    assert "gen_ai.input.messages" in reasons[genai_llm["spanId"]] and "JSON" in reasons[genai_llm["spanId"]]
    # The rest of each program still maps: its other model calls, its tool, its handoff.
    runs = mapped(spans)
    for events in runs.values():
        check_log(events)
    assert sum(len(of(e, "agent.invocation.started")) for e in runs.values()) == (
        len(s.GRAPH_CALLS) + len(s.AGENTS_CALLS) - 2)
    assert sum(len(of(e, "agent.toolReturned")) for e in runs.values()) == 2
    assert sum(len(of(e, "runOrchestrator.decided")) for e in runs.values()) == 2


# --- Google ADK without captured content --------------------------------------------------------------------------

def test_an_adk_transfer_without_content_still_starts_the_child_run():
    """Without content capture ADK records no tool arguments: the transfer goes to the next agent that starts."""
    spans = spans_of("adk", "genai")
    for sp in spans:
        for key in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.input.messages",
                    "gen_ai.output.messages", "gen_ai.system_instructions"):
            sp["attributes"].pop(key, None)
    runs, root, child = root_and_child(mapped(spans))
    assert root == s.ADK_SESSION and child.startswith(f"{s.ADK_SESSION}/{s.SPECIALIST}/")
    assert of(runs[root], "runOrchestrator.decided") == [
        {"agentId": s.TRIAGE, "decision": {"nextWorkerIds": [s.SPECIALIST]}}]


def test_the_system_instructions_are_part_of_the_cache_key():
    span = next(sp for sp in spans_of("adk", "genai") if sp["attributes"].get("gen_ai.operation.name")
                == "generate_content")
    changed = copy.deepcopy(span)
    changed["attributes"]["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": "Be terse."}])
    as_text = copy.deepcopy(span)
    as_text["attributes"]["gen_ai.system_instructions"] = "Be terse."  # plain text, not JSON parts
    keys = [_mapped_call(sp)["agent.invocation.started"]["cacheKey"] for sp in (span, changed, as_text)]
    assert keys[0] != keys[1] == keys[2]
