"""The RunEventDoc envelope: field names, limits and the closed list of event types.

The envelope is OpenWOP's ``run-event.schema.json`` (RunEventDoc), unchanged:
whatever the store adds (hash chain, Kafka position, tenant) travels beside the
doc, never inside it, so an exported event still validates upstream.
:func:`agentlog.schemas.validate.validate_doc` checks the same rules with plain Python
(it runs per event); :class:`RunEventDoc` is the typed view for SDK users and docs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

__all__ = [
    "ENVELOPE_FIELDS",
    "ID_MAX_LENGTH",
    "OPTIONAL_FIELDS",
    "REQUIRED_FIELDS",
    "RUN_EVENT_TYPES",
    "RUN_EVENT_TYPE_LIST",
    "RunEventDoc",
]

#: ``eventId``, ``runId``, ``nodeId``, ``causationId`` upper bound (upstream maxLength).
ID_MAX_LENGTH = 128

REQUIRED_FIELDS: tuple[str, ...] = ("eventId", "runId", "type", "payload", "timestamp", "sequence")
OPTIONAL_FIELDS: tuple[str, ...] = ("nodeId", "schemaVersion", "engineVersion", "causationId")
ENVELOPE_FIELDS: frozenset[str] = frozenset(REQUIRED_FIELDS + OPTIONAL_FIELDS)

#: ``$defs.RunEventType.enum`` of openwop ``schemas/run-event.schema.json`` @ 02cc1358, in upstream order.
#: A new upstream type is added here (and only here) when we adopt that schema revision.
RUN_EVENT_TYPE_LIST: tuple[str, ...] = (
    "run.started",
    "run.completed",
    "run.failed",
    "run.cancelled",
    "run.resuming",
    "run.paused",
    "run.resumed",
    "run.restored-from-snapshot",
    "run.dead_lettered",
    "node.started",
    "node.completed",
    "node.failed",
    "node.suspended",
    "node.suspend-failed",
    "node.resumed",
    "node.retried",
    "node.skipped",
    "node.cancelled",
    "approval.requested",
    "approval.received",
    "approval.granted",
    "approval.rejected",
    "approval.overridden",
    "clarification.requested",
    "clarification.resolved",
    "interrupt.requested",
    "interrupt.resolved",
    "channel.written",
    "artifact.created",
    "output.chunk",
    "variable.changed",
    "log.appended",
    "version.pinned",
    "workflow.restored",
    "workflow.loopback-limit",
    "workflow.stalled",
    "cap.breached",
    "lease.acquired",
    "lease.renewed",
    "lease.lost",
    "lease.handed-off",
    "replay.diverged",
    "replay.divergedAtRefusal",
    "agent.reasoned",
    "agent.reasoning.delta",
    "provider.usage",
    "prompt.composed",
    "agent.promptResolved",
    "model.capability.substituted",
    "model.capability.insufficient",
    "envelope.retry.attempted",
    "envelope.retry.exhausted",
    "envelope.refusal",
    "envelope.truncated",
    "envelope.nlToFormat.engaged",
    "envelope.recovery.applied",
    "agent.toolCalled",
    "agent.toolReturned",
    "agent.handoff",
    "agent.decided",
    "agent.invocation.started",
    "agent.invocation.completed",
    "eval.started",
    "eval.scored",
    "eval.completed",
    "deployment.promoted",
    "deployment.rolled-back",
    "deployment.canary.adjusted",
    "deployment.state.changed",
    "runOrchestrator.decided",
    "node.dispatched",
    "conversation.opened",
    "conversation.exchanged",
    "conversation.closed",
    "memory.compacted",
    "memory.written",
    "agent.memory.consolidated",
    "commitment.fired",
    "workspace.updated",
    "core.workflowChain.event",
    "core.workflowChain.confidence-escalated",
    "connector.authorized",
    "connector.auth_expired",
    "authorization.decided",
)
RUN_EVENT_TYPES: frozenset[str] = frozenset(RUN_EVENT_TYPE_LIST)

_Id = Annotated[StrictStr, Field(min_length=1, max_length=ID_MAX_LENGTH)]
_NonNegativeInt = Annotated[StrictInt, Field(ge=0)]


class RunEventDoc(BaseModel):
    """Typed view of one RunEventDoc; ``model_dump(exclude_unset=True)`` gives the wire dict back.

    ``type`` is a plain string here (checked against :data:`RUN_EVENT_TYPES` by
    ``validate_doc``) so that reading an old log never fails on a retired type.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    eventId: _Id
    runId: _Id
    type: StrictStr
    payload: Any
    timestamp: StrictStr
    sequence: _NonNegativeInt
    nodeId: _Id | None = None
    schemaVersion: _NonNegativeInt | None = None
    engineVersion: StrictStr | None = None
    causationId: _Id | None = None

    def to_doc(self) -> dict[str, Any]:
        """The wire dict: optional fields left out when they were not given."""
        return self.model_dump(mode="python", exclude_unset=True)
