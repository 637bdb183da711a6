"""Payload models of the interpreted types: each accepts its shape and rejects breakage."""

from __future__ import annotations

import pytest

from agentlog.schemas.errors import EventRejected
from agentlog.schemas.payloads import PAYLOAD_MODELS
from agentlog.schemas.validate import validate_doc, validate_payload

GOOD: dict[str, dict] = {
    "run.started": {"bindings": {"engineVersion": "1.2.0", "policyVersion": "p7"},
                    "replayOf": {"sourceRunId": "r0", "fromSeq": 3, "mode": "mock"}, "runClass": "ci.nightly-2",
                    "hostField": 1},
    "run.completed": {"status": "completed"},
    "run.failed": {"error": {"code": "node_failed", "message": "boom", "details": {}}},
    "run.cancelled": {},
    "run.paused": {"reason": "approval"},
    "run.resumed": {},
    "variable.changed": {"name": "x", "value": None},
    "channel.written": {"channel": "out", "value": {"a": [1]}},
    "runOrchestrator.decided": {"agentId": "sup", "decision": {"nextWorkerIds": ["w1"], "outputMapping": {"a": "b"}, "kind": "next-worker"}, "iteration": 1},
    "node.dispatched": {"childRunId": "c1", "childWorkflowId": "w1", "childStatus": "running"},
    "core.workflowChain.event": {"phase": "output.harvested", "workerId": "w1", "parentRunId": "p", "childRunId": "c1",
                                 "harvestedKeys": ["a"], "attestation": {"checksum": "ab", "algorithm": "sha256"},
                                 "causationHostId": "h2"},
    "agent.toolCalled": {"callId": "c", "tool": "search", "args": {"q": "x"}},
    "agent.toolReturned": {"callId": "c", "result": [1, 2]},
    "agent.invocation.started": {"request": {"provider": "p", "model": "m", "messages": []}, "cacheKey": "k" * 64, "recipe": "openwop-semantic-request-v2"},
    "agent.invocation.completed": {"cacheKey": "k", "envelope": {"text": "hi"}, "usage": {"inputTokens": 1}},
    "envelope.refusal": {"cacheKey": "k", "reason": "policy"},
    "provider.usage": {"provider": "anthropic", "model": "m", "inputTokens": 10, "outputTokens": 0, "costCents": 3, "cacheHit": False},
    "node.retried": {"attempt": 2, "errorCode": "ERR_HTTP_503"},
    "replay.diverged": {"sourceRunId": "r", "atSequence": 4, "divergenceKind": "output", "divergencePoint": "variable.changed", "extra": 1},
    "replay.divergedAtRefusal": {"sourceRunId": "r", "atSequence": 4, "originalEnvelopeKind": "valid", "replayEnvelopeKind": "refusal", "refusalReason": "x"},
}

BAD: list[tuple[str, object]] = [
    ("run.started", {"bindings": None}),
    ("run.started", {"runClass": "c i"}),
    ("run.started", {"runClass": ""}),
    ("run.started", {"runClass": 2}),
    ("run.started", {"bindings": {"engineVersion": 2}}),
    ("run.started", {"replayOf": {"sourceRunId": "r", "fromSeq": -1, "mode": "live"}}),
    ("run.started", {"replayOf": {"sourceRunId": "r", "fromSeq": True, "mode": "live"}}),
    ("run.started", {"replayOf": {"sourceRunId": "r", "fromSeq": 0, "mode": "rewind"}}),
    ("run.started", {"replayOf": {"fromSeq": 0, "mode": "live"}}),
    ("run.started", []),
    ("run.completed", "done"),
    ("run.failed", {"error": {"code": "x"}}),
    ("run.failed", {"error": {"code": "", "message": "m"}}),
    ("variable.changed", {"value": 1}),
    ("variable.changed", {"name": "x"}),
    ("variable.changed", {"name": 3, "value": 1}),
    ("channel.written", {"channel": "c"}),
    ("runOrchestrator.decided", {"agentId": "ab", "decision": {}}),
    ("runOrchestrator.decided", {"agentId": "sup"}),
    ("runOrchestrator.decided", {"agentId": "sup", "decision": {}, "extra": 1}),
    ("runOrchestrator.decided", {"agentId": "sup", "decision": {"nextWorkerIds": "w1"}}),
    ("runOrchestrator.decided", {"agentId": "sup", "decision": {}, "iteration": 0}),
    ("node.dispatched", {"childRunId": "c"}),
    ("node.dispatched", {"childRunId": "c", "childWorkflowId": "w", "note": "x"}),
    ("core.workflowChain.event", {"phase": "dispatch.exploded", "workerId": "w", "parentRunId": "p"}),
    ("core.workflowChain.event", {"phase": "dispatch.began", "workerId": "w"}),
    ("core.workflowChain.event", {"phase": "dispatch.began", "workerId": "w", "parentRunId": "p", "extra": 1}),
    ("core.workflowChain.event", {"phase": "dispatch.began", "workerId": "", "parentRunId": "p"}),
    ("core.workflowChain.event", {"phase": "output.harvested", "workerId": "w", "parentRunId": "p", "harvestedKeys": [1]}),
    ("core.workflowChain.event", {"phase": "child.completed", "workerId": "w", "parentRunId": "p", "childRunId": None}),
    ("core.workflowChain.event", {"phase": "output.harvested", "workerId": "w", "parentRunId": "p",
                                  "attestation": {"checksum": "a", "algorithm": "md5"}}),
    ("agent.toolCalled", {"callId": "c", "tool": "t"}),
    ("agent.toolReturned", {"callId": "c"}),
    ("agent.invocation.started", {"request": "text", "cacheKey": "k", "recipe": "v2"}),
    ("agent.invocation.started", {"request": {}, "cacheKey": "k"}),
    ("agent.invocation.completed", {"envelope": {}}),
    ("envelope.refusal", {"reason": "x"}),
    ("envelope.refusal", {"cacheKey": "k", "reason": "x", "other": 1}),
    ("provider.usage", {"provider": "p", "model": "m", "inputTokens": -1, "outputTokens": 0}),
    ("provider.usage", {"provider": "p", "model": "m", "inputTokens": 1.5, "outputTokens": 0}),
    ("provider.usage", {"provider": "p", "model": "m", "inputTokens": "1", "outputTokens": 0}),
    ("provider.usage", {"provider": "p", "model": "m", "inputTokens": 1, "outputTokens": 0, "tenant": "t"}),
    ("provider.usage", {"provider": "p", "model": "m", "inputTokens": 1, "outputTokens": 0, "currency": "usd"}),
    ("node.retried", {"attempt": 1}),
    ("node.retried", {"attempt": "1", "errorCode": "E"}),
    ("replay.diverged", {"sourceRunId": "r"}),
    ("replay.diverged", {"sourceRunId": "r", "atSequence": 0, "divergenceKind": "vibes"}),
    ("replay.divergedAtRefusal", {"sourceRunId": "r", "atSequence": 1, "originalEnvelopeKind": "valid", "replayEnvelopeKind": "valid"}),
    ("replay.divergedAtRefusal", {"sourceRunId": "r", "atSequence": 1, "originalEnvelopeKind": "valid", "replayEnvelopeKind": "refusal", "x": 1}),
]


def _doc(event_type: str, payload: object) -> dict:
    return {"eventId": "e", "runId": "r", "type": event_type, "payload": payload,
            "timestamp": "2025-01-01T00:00:00Z", "sequence": 0}


def test_every_interpreted_type_has_a_good_example():
    assert set(GOOD) == set(PAYLOAD_MODELS)


@pytest.mark.parametrize("event_type", sorted(GOOD))
def test_good_payload_accepted(event_type):
    assert validate_doc(_doc(event_type, GOOD[event_type]))["payload"] == GOOD[event_type]


def test_every_interpreted_type_has_a_rejection_case():
    assert {t for t, _ in BAD} == set(PAYLOAD_MODELS) - {"run.cancelled", "run.paused", "run.resumed"}


@pytest.mark.parametrize(("event_type", "payload"), BAD, ids=[f"{t}-{i}" for i, (t, _) in enumerate(BAD)])
def test_bad_payload_rejected(event_type, payload):
    with pytest.raises(EventRejected) as info:
        validate_doc(_doc(event_type, payload))
    assert info.value.code == "invalid_payload"
    assert "\n" not in info.value.detail


def test_upstream_refusal_shape_accepted():
    upstream = {"nodeId": "n", "provider": "p", "model": "m", "refusalText": None, "safetyCategory": "x"}
    validate_doc(_doc("envelope.refusal", upstream))


@pytest.mark.parametrize("event_type", ["run.completed", "run.cancelled", "run.paused", "run.resumed"])
def test_lifecycle_null_payload_is_read_as_empty(event_type):
    validate_doc(_doc(event_type, None))


def test_opaque_types_accept_any_json():
    for payload in (None, 1, "x", [1, {"a": None}], {"anything": True}):
        validate_doc(_doc("node.started", payload))
    assert validate_payload("node.started", {"x": 1}) is None


def test_open_models_keep_host_fields():
    model = validate_payload("variable.changed", {"name": "x", "value": 1, "hostNote": "kept"})
    assert model.model_extra == {"hostNote": "kept"}
