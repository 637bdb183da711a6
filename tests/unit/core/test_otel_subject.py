"""The data subject a run mapped from spans names in ``run.started`` ``payload.subjectId`` (SPEC §12).

OTel: ``user.id``, else ``enduser.id`` (on the span or its resource), else the conversation; absent
all, no ``subjectId`` and the run is its own subject. The spans are dicts shaped as the OTLP
decoder makes them, mapped in memory by :func:`map_trace`; no broker.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentlog.core.otel import map_trace
from agentlog.core.otel_read import subject

TRACE = "ab" * 16


def _span(span_id: str, attributes: dict[str, Any], *, parent: str = "", start: int = 1_000, end: int = 9_000,
          name: str = "invoke_agent assistant", resource: dict[str, Any] | None = None) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE, "spanId": span_id, "parentSpanId": parent, "name": name, "kind": 1,
        "startNs": str(start), "endNs": str(end), "attributes": attributes, "status": {"code": 0, "message": ""},
        "scope": "test",
    }
    if resource is not None:
        span["resource"] = resource
    return span


def _agent(span_id: str, agent: str = "assistant", **attributes: Any) -> dict[str, Any]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent, **attributes}


def _started(*spans: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run id → the payload of its ``run.started``, for a trace of ``spans``."""
    emission = map_trace(TRACE, {s["spanId"]: s for s in spans}, published={}, cursors={})
    assert all(d["type"] != "log.appended" for d in emission.docs), "every span maps (none opaque or unmapped)"
    return {d["runId"]: d["payload"] for d in emission.docs if d["type"] == "run.started"}


@pytest.mark.parametrize(("attributes", "resource", "expected"), [
    ({"user.id": "u-span", "enduser.id": "e-span", "gen_ai.conversation.id": "c"}, {"user.id": "u-res"}, "u-span"),
    ({"enduser.id": "e-span", "gen_ai.conversation.id": "c"}, {"user.id": "u-res"}, "u-res"),
    ({"enduser.id": "e-span", "gen_ai.conversation.id": "c"}, {"enduser.id": "e-res"}, "e-span"),
    ({"gen_ai.conversation.id": "c"}, {"enduser.id": "e-res"}, "e-res"),
    ({"gen_ai.conversation.id": "c", "session.id": "s"}, {}, "c"),
    ({"session.id": "s"}, {"service.name": "svc"}, "s"),
    ({"user.id": 42, "gen_ai.conversation.id": "c"}, None, "42"),
], ids=["span-user", "resource-user-over-enduser", "span-enduser", "resource-enduser", "conversation",
        "session", "int-user"])
def test_the_subject_follows_user_then_enduser_then_the_conversation(attributes, resource, expected):
    root = _span("01" * 8, _agent("01", **attributes), resource=resource)
    assert subject(root) == expected
    [payload] = _started(root).values()
    assert payload["subjectId"] == expected


@pytest.mark.parametrize("value", ["", "   ", True, 1.5, None, ["u"], {"id": "u"}])
def test_an_unusable_identity_is_passed_over_not_rejected(value):
    root = _span("01" * 8, _agent("01", **{"user.id": value, "enduser.id": "e-1"}), resource={"user.id": value})
    [payload] = _started(root).values()
    assert payload["subjectId"] == "e-1"


def test_no_identity_and_no_conversation_leaves_the_subject_out():
    root = _span("01" * 8, _agent("01"), resource={"service.name": "svc"})
    started = _started(root)
    assert list(started) == [TRACE]  # the run is the trace, and its own subject
    assert "subjectId" not in started[TRACE]


def test_only_the_span_that_starts_the_run_names_the_subject():
    root = _span("01" * 8, _agent("01"))
    inner = _span("02" * 8, _agent("02", "helper", **{"user.id": "u-inner"}), parent="01" * 8, start=2_000,
                  end=3_000, name="invoke_agent helper")
    chat = _span("03" * 8, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "user.id": "u-chat"},
                 parent="02" * 8, start=2_100, end=2_900, name="chat m")
    started = _started(root, inner, chat)
    assert list(started) == [TRACE] and "subjectId" not in started[TRACE]


def test_a_child_run_names_its_own_subject_from_its_own_span_only():
    root = _span("01" * 8, _agent("01", "planner", **{"gen_ai.conversation.id": "c-planner", "user.id": "alice"}),
                 name="invoke_agent planner")
    other = _span("02" * 8, _agent("02", "researcher", **{"gen_ai.conversation.id": "c-researcher"}),
                  parent="01" * 8, start=2_000, end=3_000, name="invoke_agent researcher")
    handoff = _span("03" * 8, {"gen_ai.operation.name": "handoff", "gen_ai.handoff.to_agent": "writer"},
                    parent="01" * 8, start=4_000, end=4_100, name="handoff")
    writer = _span("04" * 8, _agent("04", "writer"), parent="01" * 8, start=5_000, end=6_000,
                   name="invoke_agent writer")
    started = _started(root, other, handoff, writer)
    assert started.pop("c-planner")["subjectId"] == "alice"
    assert started.pop("c-researcher")["subjectId"] == "c-researcher"  # its own conversation, not the parent's user
    [(child, payload)] = started.items()
    assert child.startswith("c-planner/writer/")
    assert "subjectId" not in payload  # the conversation it inherits does not count


@pytest.mark.parametrize(("program", "instrumentation"), [("openai_agents", "openllmetry"),
                                                          ("openai_agents", "openinference")])
def test_a_child_run_names_its_parent_so_that_erasing_the_parent_reaches_it(program, instrumentation):
    """The recorded corpus: the handoff's child run carries ``parentRunId`` (the keyring's parent link)."""
    from tests.unit.core.test_otel_corpus import program_runs

    runs, root, child = program_runs(program, instrumentation)
    assert runs[child][0]["type"] == "run.started"
    assert runs[child][0]["payload"]["parentRunId"] == root
    assert "parentRunId" not in runs[root][0]["payload"]


@pytest.mark.parametrize(("attributes", "resource", "expected"), [
    ({"agentlog.run.class": "ci"}, {"deployment.environment.name": "prod"}, "ci"),
    ({}, {"deployment.environment.name": "prod"}, "prod"),
    ({"deployment.environment": "staging"}, {"deployment.environment.name": "prod"}, "prod"),
    ({"agentlog.run.class": "not a class"}, {"deployment.environment": "dev"}, "dev"),
    ({"agentlog.run.class": 7}, None, None),
    ({}, {"service.name": "svc"}, None),
], ids=["ours-first", "environment-on-the-resource", "name-before-the-old-key", "invalid-passed-over", "not-a-string",
        "none"])
def test_the_run_class_is_ours_then_the_deployment_environment(attributes, resource, expected):
    root = _span("01" * 8, _agent("01", **attributes), resource=resource)
    [payload] = _started(root).values()
    assert payload.get("runClass") == expected and payload["source"] == "opentelemetry"
