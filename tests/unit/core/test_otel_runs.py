"""One conversation over two traces: the run-keyed stage (``sequence_run``) makes it one whole run.

The spans come from the real OpenTelemetry SDK (GenAI attributes set the way instrumentations
set them), go through the SDK's OTLP encoder and our decoder, are planned per trace
(:func:`plan_trace`, stage 1) in shuffled order and published interleaved, then sequenced per
run (:func:`sequence_run`, stage 2) with an index the test keeps. The expectations (contiguous
sequences, causation naming earlier events, schema validity, one event per span role) come
from the SPEC and the upstream schema, not from the mapper.
"""

from __future__ import annotations

import json
import random

from jsonschema import Draft202012Validator
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlog.core.otel import Cursor, plan_trace, sequence_run
from agentlog.schemas.upstream import upstream_file
from agentlog.schemas.validate import validate_doc
from agentlog.worker.otlp import decode_request, span_dicts

SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
CONV = "conv-two-turns"


def conversation_spans(provider: TracerProvider, conversation: str = CONV) -> None:
    """Two turns of one conversation, each its own trace: invoke_agent → chat, execute_tool, chat."""
    tracer = provider.get_tracer("test-genai")
    for turn in range(2):
        with tracer.start_as_current_span("invoke_agent assistant", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "assistant",
                "gen_ai.conversation.id": conversation}):
            with tracer.start_as_current_span("chat test-model", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "test",
                    "gen_ai.request.model": "test-model", "gen_ai.usage.input_tokens": 10 + turn,
                    "gen_ai.usage.output_tokens": 3, "gen_ai.response.finish_reasons": ("tool_call",)}):
                pass
            with tracer.start_as_current_span("execute_tool lookup", attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                    "gen_ai.tool.call.id": f"call-{turn}"}):
                pass
            with tracer.start_as_current_span("chat test-model", attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.provider.name": "test",
                    "gen_ai.request.model": "test-model", "gen_ai.usage.input_tokens": 20,
                    "gen_ai.usage.output_tokens": 5, "gen_ai.response.finish_reasons": ("stop",)}):
                pass


def _decoded(provider_spans) -> list[dict]:
    body = encode_spans(provider_spans).SerializeToString()
    decoded, refused = span_dicts(decode_request(body, "application/x-protobuf"))
    assert refused == []
    return decoded


def _spans() -> list[dict]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    conversation_spans(provider)
    return _decoded(memory.get_finished_spans())


class RunIndex:
    """Stage 2's table for one run, as the worker keeps it: a cursor and eventId → sequence."""

    def __init__(self) -> None:
        self.cursor = Cursor()
        self.ids: dict[str, int] = {}
        self.log: list[dict] = []

    def feed(self, trace_id: str, events: list[dict]) -> int:
        done = sequence_run(self.cursor, self.ids.__contains__, trace_id, events)
        for doc in done.docs:
            self.ids[doc["eventId"]] = doc["sequence"]
        self.log.extend(done.docs)
        self.cursor = done.cursor
        return len(done.docs)


def _check_run(log: list[dict]) -> None:
    seen: set[str] = set()
    for i, doc in enumerate(log):
        assert doc["sequence"] == i
        assert doc["runId"] == CONV
        if i == 0:
            assert "causationId" not in doc
        else:
            assert doc.get("causationId") in seen, f"{doc['type']} at {i} names a later or unknown event"
        validate_doc(doc)
        VALIDATOR.validate(doc)
        seen.add(doc["eventId"])


def test_a_conversation_over_two_traces_is_one_contiguous_run() -> None:
    spans = _spans()
    traces = sorted({s["traceId"] for s in spans})
    assert len(traces) == 2
    rng = random.Random(16)
    # Each trace published in two parts (its spans shuffled), the four parts interleaved across traces.
    records: list[tuple[str, list[dict]]] = []
    for trace in traces:
        mine = [s for s in spans if s["traceId"] == trace]
        rng.shuffle(mine)
        published: dict = {}
        for part in (mine[:2], mine[2:]):
            plan = plan_trace(trace, {s["spanId"]: s for s in part}, published=published)
            published = {**published, **plan.published}
            assert set(plan.runs) <= {CONV}
            records.extend((trace, events) for events in plan.runs.values())
    order = [records[2], records[0], records[3], records[1]]  # trace 2 first, then interleaved
    run = RunIndex()
    for trace, events in order:
        run.feed(trace, events)
    _check_run(run.log)
    # Every span's roles are there once: 2 × (run.started/completed + 2 × 3 chat events + 2 tool events).
    types = [d["type"] for d in run.log]
    assert len(types) == len(set(d["eventId"] for d in run.log)) == 2 * (2 + 2 * 3 + 2)
    assert types.count("provider.usage") == 4
    assert types.count("run.started") == 2 == types.count("run.completed")
    # A re-emission (stage 1 redelivered, or a trace re-planned) adds nothing, in any order.
    before = list(run.log)
    for trace, events in reversed(records):
        assert run.feed(trace, events) == 0
    assert run.log == before


def test_a_planned_cause_the_run_does_not_have_yet_becomes_the_previous_event() -> None:
    spans = _spans()
    trace = spans[0]["traceId"]
    mine = {s["spanId"]: s for s in spans if s["traceId"] == trace}
    plan = plan_trace(trace, mine, published={})
    events = plan.runs[CONV]
    # The end of a tool call names its start; fed alone (its start was never sequenced), the cause
    # must fall back to the run's previous event instead of dangling.
    returned = next(e for e in events if e["doc"]["type"] == "agent.toolReturned")
    assert returned["doc"]["causationId"] not in {"", None}
    run = RunIndex()
    run.feed(trace, [events[0]])
    run.feed(trace, [returned])
    assert run.log[1]["causationId"] == run.log[0]["eventId"]
    _check_run(run.log)
