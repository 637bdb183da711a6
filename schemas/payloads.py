"""Typed payloads for the event types the store interprets.

Two families, and the difference matters for forward compatibility:

* **Upstream-closed** shapes (``additionalProperties: false`` in openwop's
  ``run-event-payloads.schema.json``): ``core.workflowChain.event``,
  ``runOrchestrator.decided``, ``node.dispatched``, ``replay.divergedAtRefusal``,
  ``provider.usage``, ``envelope.refusal``. An unknown field is an error
  (``extra="forbid"``), exactly as upstream.
* **Our conventions** (SPEC §3) for the rest: the fields we read are typed, a
  host may add any other field (``extra="allow"``).

Every model is strict: ``"5"`` is not an integer and ``true`` is not ``1``,
because a lax coercion here would make two hosts hash different bytes for
what we claimed was the same event. Optional fields are "absent or typed":
an explicit ``null`` is refused unless upstream allows it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

__all__ = [
    "AgentInvocationCompleted",
    "AgentInvocationStarted",
    "AgentToolCalled",
    "AgentToolReturned",
    "Attestation",
    "Bindings",
    "ChainPhase",
    "ChannelWritten",
    "CoreWorkflowChainEvent",
    "EnvelopeRefusal",
    "ErrorObject",
    "NodeDispatched",
    "NodeRetried",
    "NULLABLE_PAYLOAD_TYPES",
    "OrchestratorDecision",
    "PAYLOAD_MODELS",
    "ProviderUsage",
    "RUN_CLASS",
    "ReplayDiverged",
    "ReplayDivergedAtRefusal",
    "ReplayOf",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunOrchestratorDecided",
    "RunPaused",
    "RunResumed",
    "RunStarted",
    "VariableChanged",
]

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
NonNegativeNumber = Annotated[StrictInt | StrictFloat, Field(ge=0)]

ChainPhase = Literal[
    "dispatch.began",
    "dispatch.succeeded",
    "dispatch.failed",
    "child.completed",
    "child.failed",
    "child.cancelled",
    "output.harvested",
]

# ``field: T = ABSENT`` keeps the default unvalidated (so "absent" is fine) while an
# explicit ``null`` on the wire still has to be a ``T`` and therefore fails.
ABSENT: Any = None


class _Open(BaseModel):
    """Our convention: typed fields we read, anything else a host adds is kept."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class _Closed(BaseModel):
    """Upstream ``additionalProperties: false``: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- shared shapes ----------------------------------------------------------------


class ErrorObject(_Open):
    """Upstream ``_errorObject`` (open)."""

    code: NonEmptyStr
    message: NonEmptyStr
    details: dict[str, Any] = ABSENT
    retryable: StrictBool = ABSENT


class Attestation(_Closed):
    """RFC 0063 harvest checksum (closed upstream)."""

    checksum: NonEmptyStr
    algorithm: Literal["sha256"]


# --- run lifecycle ----------------------------------------------------------------


class Bindings(_Open):
    """Versions a run binds at start (MACP §3); a replay under others is a what-if."""

    engineVersion: StrictStr = ABSENT
    modeVersion: StrictStr = ABSENT
    configVersion: StrictStr = ABSENT
    policyVersion: StrictStr = ABSENT


class ReplayOf(_Open):
    """Marks a run as a host replay of ``sourceRunId`` from ``fromSeq`` (RFC 0041 §C)."""

    sourceRunId: NonEmptyStr
    fromSeq: NonNegativeInt
    mode: Literal["verify", "mock", "live", "dry_run"]


#: A run's class (``ci``, ``dev``, ``prod``): what retention and metrics-only mode choose by (README "Personal data").
#: Letters, digits, ``_``, ``.`` and ``-``, at most 64: the one rule for every place a class is named.
RUN_CLASS: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RunClass = Annotated[StrictStr, Field(pattern=f"^{RUN_CLASS.pattern}$")] | None


class RunStarted(_Open):
    bindings: Bindings = ABSENT
    replayOf: ReplayOf = ABSENT
    runClass: RunClass = ABSENT


class RunCompleted(_Open):
    pass


class RunFailed(_Open):
    error: ErrorObject = ABSENT


class RunCancelled(_Open):
    pass


class RunPaused(_Open):
    pass


class RunResumed(_Open):
    pass


# --- state ------------------------------------------------------------------------


class VariableChanged(_Open):
    """``value`` is required but may be JSON ``null`` (a variable set to null)."""

    name: NonEmptyStr
    value: Any


class ChannelWritten(_Open):
    channel: NonEmptyStr
    value: Any


# --- multi-agent handoff (RFC 0037) ------------------------------------------------


class OrchestratorDecision(_Open):
    """The supervisor's decision; only the fields the handoff machine reads are typed."""

    nextWorkerIds: list[NonEmptyStr] = ABSENT
    outputMapping: dict[str, Any] | list[Any] = ABSENT


class RunOrchestratorDecided(_Closed):
    agentId: Annotated[StrictStr, Field(min_length=3, max_length=256)]
    decision: OrchestratorDecision
    iteration: Annotated[StrictInt, Field(ge=1)] = ABSENT
    causationHostId: NonEmptyStr = ABSENT


class NodeDispatched(_Closed):
    childRunId: NonEmptyStr
    childWorkflowId: NonEmptyStr
    childStatus: StrictStr = ABSENT


class CoreWorkflowChainEvent(_Closed):
    """One handoff transition (upstream ``coreWorkflowChainEvent``, closed).

    Phase-dependent rules the schema only states in prose (``childRunId`` from
    ``dispatch.succeeded`` on, ``harvestedKeys`` on ``output.harvested``) are
    checked by the handoff processor, which reports them as violations on the
    run instead of dropping the event here.
    """

    phase: ChainPhase
    workerId: NonEmptyStr
    parentRunId: NonEmptyStr
    childRunId: NonEmptyStr = ABSENT
    harvestedKeys: list[StrictStr] = ABSENT
    attestation: Attestation = ABSENT
    error: ErrorObject = ABSENT
    causationHostId: NonEmptyStr = ABSENT


# --- tools and LLM calls ------------------------------------------------------------


class AgentToolCalled(_Open):
    callId: NonEmptyStr
    tool: NonEmptyStr
    args: Any


class AgentToolReturned(_Open):
    """``result`` is the observable result replay compares (bytes of the call may differ)."""

    callId: NonEmptyStr
    result: Any


class AgentInvocationStarted(_Open):
    """``request`` is shaped like the cache-key vector inputs; ``cacheKey`` was computed by ``recipe``."""

    request: dict[str, Any]
    cacheKey: NonEmptyStr
    recipe: NonEmptyStr


class AgentInvocationCompleted(_Open):
    """A valid LLM envelope (the opposite of ``envelope.refusal`` for refusal divergence)."""

    cacheKey: NonEmptyStr
    envelope: Any
    usage: dict[str, Any] = ABSENT


class EnvelopeRefusal(_Closed):
    """The provider refused. Two shapes are accepted, and may be combined:

    * ours (SPEC §3): ``{cacheKey, reason}`` — what replay pairs with the original call;
    * upstream ``envelopeRefusal`` (closed): ``{nodeId, provider, model, refusalText?, safetyCategory?}``.

    Closed like upstream: a field outside both shapes is an error.
    """

    cacheKey: NonEmptyStr = ABSENT
    reason: StrictStr = ABSENT
    nodeId: StrictStr = ABSENT
    provider: StrictStr = ABSENT
    model: StrictStr = ABSENT
    refusalText: StrictStr | None = ABSENT
    safetyCategory: StrictStr | None = ABSENT

    @model_validator(mode="after")
    def _one_shape_complete(self) -> EnvelopeRefusal:
        ours = {"cacheKey", "reason"} <= self.model_fields_set
        upstream = {"nodeId", "provider", "model"} <= self.model_fields_set
        if not (ours or upstream):
            raise ValueError("needs {cacheKey, reason} or upstream {nodeId, provider, model}")
        return self


class ProviderUsage(_Closed):
    """Upstream ``providerUsage`` (closed) plus our ``costCents`` (SPEC §3)."""

    provider: NonEmptyStr
    model: NonEmptyStr
    inputTokens: NonNegativeInt
    outputTokens: NonNegativeInt
    costCents: NonNegativeNumber = ABSENT
    totalTokens: NonNegativeInt = ABSENT
    costEstimateUsd: NonNegativeNumber = ABSENT
    currency: Annotated[StrictStr, Field(pattern=r"^[A-Z]{3}$")] = ABSENT
    cacheHit: StrictBool = ABSENT
    nodeId: StrictStr = ABSENT
    traceId: StrictStr = ABSENT


class NodeRetried(_Open):
    """Retry count and error code are replay invariants (AOS PIN-009)."""

    attempt: NonNegativeInt
    errorCode: NonEmptyStr


# --- replay outcome -----------------------------------------------------------------


class ReplayDiverged(_Open):
    sourceRunId: NonEmptyStr
    atSequence: NonNegativeInt
    originalEventId: StrictStr = ABSENT
    divergenceKind: Literal["output", "missing", "extra", "type-mismatch"] = ABSENT
    divergencePoint: StrictStr = ABSENT


class ReplayDivergedAtRefusal(_Closed):
    sourceRunId: NonEmptyStr
    atSequence: NonNegativeInt
    originalEventId: StrictStr = ABSENT
    nodeId: NonEmptyStr = ABSENT
    originalEnvelopeKind: Literal["valid", "refusal"]
    replayEnvelopeKind: Literal["valid", "refusal"]
    refusalReason: StrictStr = ABSENT

    @model_validator(mode="after")
    def _kinds_differ(self) -> ReplayDivergedAtRefusal:
        # Upstream: "MUST differ from originalEnvelopeKind — otherwise there is no divergence".
        if self.originalEnvelopeKind == self.replayEnvelopeKind:
            raise ValueError("originalEnvelopeKind and replayEnvelopeKind must differ")
        return self


#: Payload model per interpreted event type. Every other known type has an opaque payload.
PAYLOAD_MODELS: dict[str, type[BaseModel]] = {
    "run.started": RunStarted,
    "run.completed": RunCompleted,
    "run.failed": RunFailed,
    "run.cancelled": RunCancelled,
    "run.paused": RunPaused,
    "run.resumed": RunResumed,
    "variable.changed": VariableChanged,
    "channel.written": ChannelWritten,
    "runOrchestrator.decided": RunOrchestratorDecided,
    "node.dispatched": NodeDispatched,
    "core.workflowChain.event": CoreWorkflowChainEvent,
    "agent.toolCalled": AgentToolCalled,
    "agent.toolReturned": AgentToolReturned,
    "agent.invocation.started": AgentInvocationStarted,
    "agent.invocation.completed": AgentInvocationCompleted,
    "envelope.refusal": EnvelopeRefusal,
    "provider.usage": ProviderUsage,
    "node.retried": NodeRetried,
    "replay.diverged": ReplayDiverged,
    "replay.divergedAtRefusal": ReplayDivergedAtRefusal,
}

#: Lifecycle types whose payload carries nothing we need: a JSON ``null`` payload is read as ``{}``.
NULLABLE_PAYLOAD_TYPES: frozenset[str] = frozenset(
    {"run.completed", "run.cancelled", "run.paused", "run.resumed"}
)
