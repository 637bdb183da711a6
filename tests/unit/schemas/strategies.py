"""Hypothesis strategies for RunEventDocs that the contract must accept."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from agentlog.schemas.canonical import MAX_SAFE_INTEGER
from agentlog.schemas.events import RUN_EVENT_TYPE_LIST
from agentlog.schemas.payloads import PAYLOAD_MODELS

#: No wall-clock limits: the suite shares the machine with a Kafka broker and other sessions.
contract_settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

OPAQUE_TYPES = [t for t in RUN_EVENT_TYPE_LIST if t not in PAYLOAD_MODELS]

safe_ints = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | safe_ints | finite_floats | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)

ids = st.text(min_size=1, max_size=128)
non_empty = st.text(min_size=1, max_size=16)


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    moment = draw(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 12, 31)))
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if draw(st.booleans()):
        text += "." + str(draw(st.integers(0, 999999))).zfill(draw(st.integers(1, 6)))[:6]
    minutes = draw(st.integers(-23 * 60, 23 * 60))
    if minutes == 0 or draw(st.booleans()):
        return text + "Z"
    sign = "+" if minutes > 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _optional(d: dict[str, Any], draw: st.DrawFn, name: str, strategy: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        d[name] = draw(strategy)


@st.composite
def payloads(draw: st.DrawFn, event_type: str) -> Any:
    """A valid payload for ``event_type`` (extra host fields only where the model is open)."""
    p: dict[str, Any] = {}
    t = event_type
    if t not in PAYLOAD_MODELS:
        return draw(json_values)
    if t == "run.started":
        _optional(p, draw, "bindings", st.fixed_dictionaries({}, optional={
            "engineVersion": st.text(max_size=8), "modeVersion": st.text(max_size=8),
            "configVersion": st.text(max_size=8), "policyVersion": st.text(max_size=8)}))
        _optional(p, draw, "replayOf", st.fixed_dictionaries({
            "sourceRunId": non_empty, "fromSeq": st.integers(0, 1000),
            "mode": st.sampled_from(["verify", "mock", "live", "dry_run"])}))
    elif t == "run.failed":
        _optional(p, draw, "error", st.fixed_dictionaries({"code": non_empty, "message": non_empty}))
    elif t in ("variable.changed",):
        p = {"name": draw(non_empty), "value": draw(json_values)}
    elif t == "channel.written":
        p = {"channel": draw(non_empty), "value": draw(json_values)}
    elif t == "runOrchestrator.decided":
        p = {"agentId": draw(st.text(min_size=3, max_size=20)),
             "decision": draw(st.fixed_dictionaries({}, optional={
                 "nextWorkerIds": st.lists(non_empty, max_size=3),
                 "outputMapping": st.dictionaries(non_empty, st.text(max_size=5), max_size=2)}))}
        _optional(p, draw, "iteration", st.integers(1, 10))
        return p
    elif t == "node.dispatched":
        p = {"childRunId": draw(non_empty), "childWorkflowId": draw(non_empty)}
        _optional(p, draw, "childStatus", st.text(max_size=8))
        return p
    elif t == "core.workflowChain.event":
        p = {"phase": draw(st.sampled_from(["dispatch.began", "dispatch.succeeded", "dispatch.failed",
                                            "child.completed", "child.failed", "child.cancelled",
                                            "output.harvested"])),
             "workerId": draw(non_empty), "parentRunId": draw(non_empty)}
        _optional(p, draw, "childRunId", non_empty)
        _optional(p, draw, "harvestedKeys", st.lists(st.text(max_size=5), max_size=3))
        _optional(p, draw, "attestation", st.fixed_dictionaries({"checksum": non_empty,
                                                                 "algorithm": st.just("sha256")}))
        return p
    elif t == "agent.toolCalled":
        p = {"callId": draw(non_empty), "tool": draw(non_empty), "args": draw(json_values)}
    elif t == "agent.toolReturned":
        p = {"callId": draw(non_empty), "result": draw(json_values)}
    elif t == "agent.invocation.started":
        p = {"request": draw(json_objects), "cacheKey": draw(non_empty), "recipe": "openwop-semantic-request-v2"}
    elif t == "agent.invocation.completed":
        p = {"cacheKey": draw(non_empty), "envelope": draw(json_values)}
    elif t == "envelope.refusal":
        return {"cacheKey": draw(non_empty), "reason": draw(st.text(max_size=10))}
    elif t == "provider.usage":
        p = {"provider": draw(non_empty), "model": draw(non_empty),
             "inputTokens": draw(st.integers(0, 10**6)), "outputTokens": draw(st.integers(0, 10**6))}
        _optional(p, draw, "costCents", st.integers(0, 10**6) | st.floats(0, 1e6))
        return p
    elif t == "node.retried":
        p = {"attempt": draw(st.integers(0, 10)), "errorCode": draw(non_empty)}
    elif t == "replay.diverged":
        p = {"sourceRunId": draw(non_empty), "atSequence": draw(st.integers(0, 100))}
        _optional(p, draw, "divergenceKind", st.sampled_from(["output", "missing", "extra", "type-mismatch"]))
    elif t == "replay.divergedAtRefusal":
        kinds = draw(st.permutations(["valid", "refusal"]))
        return {"sourceRunId": draw(non_empty), "atSequence": draw(st.integers(0, 100)),
                "originalEnvelopeKind": kinds[0], "replayEnvelopeKind": kinds[1]}
    # Open models: hosts may add fields of their own.
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=6).map(lambda k: "x_" + k), json_values, max_size=2))
    return {**extra, **p}


@st.composite
def valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    event_type = draw(st.sampled_from(RUN_EVENT_TYPE_LIST))
    doc: dict[str, Any] = {
        "eventId": draw(ids),
        "runId": draw(ids),
        "type": event_type,
        "payload": draw(payloads(event_type)),
        "timestamp": draw(timestamps()),
        "sequence": draw(st.integers(0, MAX_SAFE_INTEGER)),
    }
    _optional(doc, draw, "nodeId", ids)
    _optional(doc, draw, "schemaVersion", st.integers(0, 1000))
    _optional(doc, draw, "engineVersion", st.text(max_size=12))
    _optional(doc, draw, "causationId", ids)
    return doc


