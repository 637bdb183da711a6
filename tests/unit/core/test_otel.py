"""The span → RunEventDoc mapping on spans a real instrumented framework (pydantic-ai) emitted.

The spans go through the SDK's own OTLP encoder and our decoder, exactly as the receiver
sees them; expectations are written from the GenAI conventions and the SPEC, not read
back from the mapper.
"""

from __future__ import annotations

import json
import random

import orjson
import pytest
from jsonschema import Draft202012Validator
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlog.core.fold import fold_all
from agentlog.core.otel import Cursor, due, event_id, map_trace, plan_trace, sequence_run, timestamp
from agentlog.demo.otel import run_planner
from agentlog.schemas.canonical import jcs
from agentlog.schemas.upstream import upstream_file
from agentlog.worker.otlp import OtlpError, decode_request, span_dicts
from tests.unit.core.test_otel_corpus import check_log

SCHEMA = json.loads(upstream_file("openwop/schemas/run-event.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def spans() -> list[dict]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    run_planner(provider)
    body = encode_spans(exporter.get_finished_spans()).SerializeToString()
    decoded, refused = span_dicts(decode_request(body, "application/x-protobuf"))
    assert refused == []
    return decoded


def _runs(docs):
    by_run: dict[str, list[dict]] = {}
    for doc in docs:
        by_run.setdefault(doc["runId"], []).append(doc)
    return by_run


def test_planner_and_child_runs(spans):
    conv = {s["attributes"]["gen_ai.agent.name"]: s["attributes"]["gen_ai.conversation.id"]
            for s in spans if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"}
    trace = spans[0]["traceId"]
    emission = map_trace(trace, {s["spanId"]: s for s in spans}, published={}, cursors={})
    runs = _runs(emission.docs)
    assert set(runs) == {conv["planner"], conv["researcher"]}
    for events in runs.values():
        check_log(events)
    planner = [d["type"] for d in runs[conv["planner"]]]
    assert planner[0] == "run.started" and planner[-1] == "run.completed"
    assert planner.count("agent.invocation.started") == 2 == planner.count("agent.invocation.completed")
    assert planner.count("provider.usage") == 2
    assert planner.index("agent.toolCalled") < planner.index("runOrchestrator.decided") < planner.index(
        "agent.toolReturned")
    phases = [d["payload"]["phase"] for d in runs[conv["planner"]] if d["type"] == "core.workflowChain.event"]
    assert phases == ["dispatch.began", "dispatch.succeeded", "child.completed"]
    child = [d["type"] for d in runs[conv["researcher"]]]
    assert child == ["run.started", "agent.invocation.started", "agent.invocation.completed", "provider.usage",
                     "run.completed"]
    # Tokens are the spans' own attributes, summed.
    tokens = sum(s["attributes"].get("gen_ai.usage.input_tokens", 0) for s in spans)
    assert tokens == sum(d["payload"]["inputTokens"] for d in emission.docs if d["type"] == "provider.usage")
    # The request content was captured, so the LLM events carry a recipe-v2 cache key.
    started = [d for d in emission.docs if d["type"] == "agent.invocation.started"]
    assert all(d["payload"]["recipe"] == "openwop-semantic-request-v2" for d in started)
    # The fold turns the planner's chain into a legal handoff (no violation) ending completed.
    state, outputs = fold_all(runs[conv["planner"]])
    assert not state["flags"]
    assert [o["phase"] for o in outputs if o["kind"] == "transition"] == [
        "dispatch.began", "dispatch.succeeded", "child.completed"]
    assert {o["childRunId"] for o in outputs if o["kind"] == "transition"} - {None} == {conv["researcher"]}


def test_arrival_order_does_not_matter_and_ids_are_deterministic(spans):
    trace = spans[0]["traceId"]
    reference = map_trace(trace, {s["spanId"]: s for s in spans}, published={}, cursors={}).docs
    for seed in range(5):
        shuffled = spans[:]
        random.Random(seed).shuffle(shuffled)
        assert map_trace(trace, {s["spanId"]: s for s in shuffled}, published={}, cursors={}).docs == reference
    tool = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool")
    assert event_id(trace, tool["spanId"], "agent.toolCalled") in {d["eventId"] for d in reference}


def test_late_spans_extend_the_runs_contiguously(spans):
    trace = spans[0]["traceId"]
    roots = [s for s in spans if s["attributes"].get("gen_ai.operation.name") != "chat"]
    late = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    first = map_trace(trace, {s["spanId"]: s for s in roots}, published={}, cursors={})
    second = map_trace(trace, {s["spanId"]: s for s in late}, published=first.published,
                       cursors={r: Cursor(c.next, c.last) for r, c in first.cursors.items()})
    for events in _runs(first.docs + second.docs).values():
        check_log(events)
    assert {d["type"] for d in second.docs} >= {"agent.invocation.started", "provider.usage"}


def test_unmapped_span_is_kept_opaque_and_errors_are_failures(spans):
    tool = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool")
    http = {**tool, "spanId": "00000000000000ab", "name": "GET /weather",
            "attributes": {"http.method": "GET"}, "status": {"code": 0, "message": ""}}
    broken = {**tool, "status": {"code": 2, "message": "tool exploded"}}
    docs = map_trace(tool["traceId"], {http["spanId"]: http, broken["spanId"]: broken}, published={},
                     cursors={}).docs
    assert [d["type"] for d in docs if d["payload"].get("source") == "opentelemetry"] == ["log.appended"]
    failed = [d for d in docs if d["type"] == "node.failed"]
    assert len(failed) == 1 and failed[0]["payload"]["error"]["message"] == "tool exploded"
    assert "agent.toolReturned" not in {d["type"] for d in docs}


def test_refusal_finish_reason_is_an_envelope_refusal(spans):
    chat = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat")
    refused = {**chat, "attributes": {**chat["attributes"], "gen_ai.response.finish_reasons": ["content_filter"]}}
    docs = map_trace(chat["traceId"], {chat["spanId"]: refused}, published={}, cursors={}).docs
    types = [d["type"] for d in docs]
    assert "envelope.refusal" in types and "agent.invocation.completed" not in types


def test_due_rule():
    entry = {"pending": ["a"], "firstMs": 1000, "lastMs": 5000, "rootSeen": False}
    knobs = {"settle_ms": 100, "grace_ms": 10_000, "max_spans": 3}
    assert not due(entry, 5200, **knobs)  # no root yet, grace not over
    assert due({**entry, "rootSeen": True}, 5100, **knobs)  # root seen and settled
    assert not due({**entry, "rootSeen": True}, 5099, **knobs)
    assert due(entry, 11_000, **knobs)  # grace over
    assert due({**entry, "pending": ["a", "b", "c"]}, 1000, **knobs)  # size limit
    assert not due({**entry, "pending": []}, 99_999, **knobs)


@pytest.mark.parametrize("body,ctype,enc", [
    (b"\xff\xfe garbage", "application/x-protobuf", ""),
    (b"not json", "application/json", ""),
    (b"plain", "application/x-protobuf", "gzip"),
])
def test_garbage_is_undecodable(body, ctype, enc):
    with pytest.raises(OtlpError) as info:
        decode_request(body, ctype, enc)
    assert info.value.code == "otlp_undecodable"


def test_json_form_with_hex_ids_and_gzip(spans):
    import gzip

    exporter_request = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "chat m",
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}]}]}]}
    body = gzip.compress(json.dumps(exporter_request).encode())
    decoded, refused = span_dicts(decode_request(body, "application/json", "gzip"))
    assert refused == [] and decoded[0]["traceId"] == "5b8efff798038103d269b633813fc60c"
    assert decoded[0]["spanId"] == "eee19b7ec3c1b174" and decoded[0]["startNs"] == "1700000000000000000"


def test_a_doc_the_sequencer_would_reject_keeps_its_slot_as_an_opaque_event(spans):
    chat = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat")
    # Captured output holding an integer JCS cannot carry: the completed event would be rejected
    # (unsafe_integer) and leave a gap; it becomes log.appended with the reason instead.
    bad = {**chat, "attributes": {**chat["attributes"], "gen_ai.output.messages": '[{"n": 18014398509481984}]'}}
    docs = map_trace(chat["traceId"], {chat["spanId"]: bad}, published={}, cursors={}).docs
    check_log(docs)
    unmapped = [d["payload"]["unmapped"] for d in docs if d["type"] == "log.appended"]
    assert [(u["type"], u["code"]) for u in unmapped] == [("agent.invocation.completed", "unsafe_integer")]


def test_docs_read_from_json_come_with_their_canonical_bytes_and_an_unmappable_one_too(spans):
    chat = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat")
    bad = {**chat, "attributes": {**chat["attributes"], "gen_ai.output.messages": '[{"n": 18014398509481984}]'}}
    trace = {s["spanId"]: s for s in spans if s["traceId"] == chat["traceId"]}
    for pending in (trace, {chat["spanId"]: bad}):
        plan = plan_trace(chat["traceId"], pending, published={})
        for events in plan.runs.values():
            parsed = orjson.loads(orjson.dumps(events))  # as the run sequencer reads them
            done = sequence_run(Cursor(), lambda eid: False, chat["traceId"], parsed, parsed=True)
            assert done.data == [jcs(doc) for doc in done.docs]
            assert done.docs == sequence_run(Cursor(), lambda eid: False, chat["traceId"], events).docs
    assert [d["payload"]["unmapped"]["code"] for d in done.docs if d["type"] == "log.appended"] == ["unsafe_integer"]


@pytest.mark.parametrize("ns", [0, 1, 999_999_999, 1_000_000_000, 1_732_700_000_123_456_789, 4_102_444_799_999_999_999])
def test_a_timestamp_is_rfc3339_utc_with_every_nanosecond(ns):
    from datetime import UTC, datetime

    whole = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    assert timestamp(ns) == timestamp(ns) == f"{whole}.{ns % 1_000_000_000:09d}Z"
