"""What in a RunEventDoc is content (what people said, what models and tools returned) and what is metadata.

Content is personal data in the general case: prompts, system prompts, model output, tool arguments and results,
variable and channel values, human messages, error messages, a rejected record's bytes. Metadata is what analytics,
the handoff machine, replay alignment and the audit queries run on: types, ids, node / agent / tool / model names,
token counts, cost, timings, status, error codes.

The rule is an allow-list: per event type, a tree of the payload members that are metadata; **every other member is
content**. A host that adds a field, or an event type this table does not name, therefore gets its fields treated as
content (sealed, erasable) rather than kept in the clear by default. The envelope (``eventId``, ``runId``, ``type``,
``timestamp``, ``sequence``, ``nodeId``, ``causationId``, versions) is metadata.

A tree maps a member name to ``True`` (the member is metadata as a whole) or to a subtree (descend: the named
members inside are metadata, the rest of that object is content). A member whose value is not an object where the
tree descends is content as a whole.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CLEAR", "DEFAULT_CLEAR", "REDACTIONS", "SEALED", "Tree", "clear_tree", "content_members", "is_sealed"]

Tree = Mapping[str, "bool | Tree"]

#: The one member of a sealed token (``agentlog.core.sealing``): ``{"$sealed": "<keyId>.<ciphertext>"}``.
SEALED = "$sealed"


#: The payload member in which the sequencer records what redaction did (``agentlog.core.redaction``): a list of
#: ``{"path", "rule", "action", "count"}``, never the original text. Metadata of every event type, so it stays clear
#: (not sealed) and the hash chain covers it; only the sequencer writes it (a published one is replaced).
REDACTIONS = "$redactions"


def is_sealed(value: Any) -> bool:
    """``value`` is a sealed token: a leaf, whatever the tree says about the member it stands for."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(SEALED), str)

_ERROR: Tree = {"code": True, "retryable": True}
_REQUEST: Tree = {
    # What selects the model and shapes its sampling: the cache-key recipe's non-message inputs.
    "provider": True, "model": True, "temperature": True, "topP": True, "topK": True, "maxOutputTokens": True,
    "seed": True, "responseFormat": True, "safetySettings": True, "stream": True,
}  # fmt: skip

#: Metadata of event types without an entry below (upstream types the store does not interpret).
DEFAULT_CLEAR: Tree = {
    "status": True, "errorCode": True, "attempt": True, "agentId": True, "workerId": True, "childRunId": True,
    "parentRunId": True, "model": True, "provider": True, "tool": True, "durationMs": True, "latencyMs": True,
    "usage": True, "verdict": True, "error": _ERROR,
}  # fmt: skip

#: Metadata per interpreted event type (``schemas/payloads.py``); everything else in the payload is content.
CLEAR: Mapping[str, Tree] = {
    "run.started": {"bindings": True, "replayOf": True, "subject": True, "runClass": True, "tags": True,
                    "parentRunId": True, "source": True},
    "run.completed": {"status": True},
    "run.failed": {"status": True, "error": _ERROR},
    "run.cancelled": {"status": True},
    "run.paused": {"status": True},
    "run.resumed": {"status": True},
    "variable.changed": {"name": True},
    "channel.written": {"channel": True},
    "runOrchestrator.decided": {"agentId": True, "iteration": True, "causationHostId": True,
                                "decision": {"nextWorkerIds": True, "outputMapping": True}},
    "node.dispatched": {"childRunId": True, "childWorkflowId": True, "childStatus": True},
    "core.workflowChain.event": {"phase": True, "workerId": True, "parentRunId": True, "childRunId": True,
                                 "harvestedKeys": True, "attestation": True, "causationHostId": True,
                                 "error": _ERROR},
    "agent.toolCalled": {"callId": True, "tool": True},
    "agent.toolReturned": {"callId": True, "tool": True, "isError": True},
    "agent.invocation.started": {"cacheKey": True, "recipe": True, "request": _REQUEST},
    "agent.invocation.completed": {"cacheKey": True, "usage": True, "finishReason": True},
    "envelope.refusal": {"cacheKey": True, "nodeId": True, "provider": True, "model": True, "safetyCategory": True},
    "provider.usage": {"provider": True, "model": True, "inputTokens": True, "outputTokens": True, "costCents": True,
                       "totalTokens": True, "costEstimateUsd": True, "currency": True, "cacheHit": True,
                       "nodeId": True, "traceId": True},
    "node.retried": {"attempt": True, "errorCode": True},
    "replay.diverged": {"sourceRunId": True, "atSequence": True, "originalEventId": True, "divergenceKind": True,
                        "divergencePoint": True},
    "replay.divergedAtRefusal": {"sourceRunId": True, "atSequence": True, "originalEventId": True, "nodeId": True,
                                 "originalEnvelopeKind": True, "replayEnvelopeKind": True},
}


# The redaction record is metadata of every payload.
DEFAULT_CLEAR = {**DEFAULT_CLEAR, REDACTIONS: True}
CLEAR = {event_type: {**tree, REDACTIONS: True} for event_type, tree in CLEAR.items()}


def clear_tree(event_type: str) -> Tree:
    """The metadata tree of ``event_type``'s payload."""
    return CLEAR.get(event_type, DEFAULT_CLEAR)


def content_members(payload: Any, tree: Tree, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every content member of ``payload`` as ``(path, value)``, outermost first, in the payload's key order.

    A payload that is not an object (an opaque event's list or scalar) is content as a whole, at path ``()``; so is
    a sealed token, wherever it stands.
    """
    if not isinstance(payload, dict) or is_sealed(payload):
        yield path, payload
        return
    for name, value in payload.items():
        rule = tree.get(name)
        if rule is True:
            continue
        if isinstance(rule, Mapping) and isinstance(value, dict) and not is_sealed(value):
            yield from content_members(value, rule, (*path, name))
        else:
            yield (*path, name), value
