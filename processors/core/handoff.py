"""Planner→worker handoff state machine (RFC 0037 §B, SPEC §5), as pure fold steps.

One machine per worker dispatch, identified by ``dispatchId`` = the eventId of
its ``dispatch.began`` (host-emitted or derived). Two ways in:

* **check** — the host emits ``core.workflowChain.event`` per transition; we
  verify legality and causation and report violations as values.
* **derive** — the host only emits ``runOrchestrator.decided``,
  ``node.dispatched`` and the child run's ``run.*``; we emit the transitions the
  host would have emitted, with deterministic eventIds so a refold or a replay
  produces the same bytes.

The state pieces live in the run state (see ``agentlog.core.fold``) so the machine
is rebuilt by the same fold everywhere; nothing here does I/O or reads a clock.
The child's outcome lives in another run (another partition), so the fold of
the parent cannot see it: a succeeded derived dispatch yields a ``link`` output,
and :func:`derive_child_outcome` turns (link, child terminal event) into the
remaining transitions. Those transitions never feed back into the parent state,
because the parent's stateHash at index *i* must depend on the parent log only.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard, cast

from agentlog.schemas.errors import AgentlogError
from agentlog.schemas.records import Transition, transition, violation

__all__ = [
    "CHAIN_EVENT",
    "FAILED_CHILD_STATUSES",
    "HANDOFF_MODES",
    "NAMESPACE",
    "PHASES",
    "TERMINAL_STATES",
    "HandoffError",
    "Phase",
    "check_chain_event",
    "derive_child_outcome",
    "derive_dispatch",
    "derived_event_id",
    "record_decision",
]

CHAIN_EVENT = "core.workflowChain.event"

#: A run state (see :func:`agentlog.core.fold.initial_state`), read-only once returned.
State = dict[str, Any]
#: One fold output: ``{"kind": "transition"|"violation"|"link", ...}`` (CONTRACT.md).
Output = dict[str, Any]

#: uuid5 namespace of derived transition eventIds. Changing it changes every
#: derived eventId ever published, so it is frozen forever.
NAMESPACE = uuid.UUID("07f2212c-18f2-48e4-87db-3c6f23603576")

HANDOFF_MODES = frozenset({"check", "derive", "auto"})

#: ``node.dispatched.childStatus`` values that mean the child was never created.
FAILED_CHILD_STATUSES = frozenset({"failed", "dispatch_failed", "rejected"})

#: States a machine never leaves. ``completed`` is not one: it waits for a harvest.
TERMINAL_STATES = frozenset({"harvested", "failed", "cancelled"})


class Phase(NamedTuple):
    """One row of SPEC §5: the transition a phase records and what must have caused it."""

    source: str
    target: str
    caused_by: str  # phase of the previous transition, or "runOrchestrator.decided"


PHASES: Mapping[str, Phase] = {
    "dispatch.began": Phase("pending", "dispatching", "runOrchestrator.decided"),
    "dispatch.succeeded": Phase("dispatching", "running", "dispatch.began"),
    "dispatch.failed": Phase("dispatching", "failed", "dispatch.began"),
    "child.completed": Phase("running", "completed", "dispatch.succeeded"),
    "child.failed": Phase("running", "failed", "dispatch.succeeded"),
    "child.cancelled": Phase("running", "cancelled", "dispatch.succeeded"),
    "output.harvested": Phase("completed", "harvested", "child.completed"),
}

_CHILD_OUTCOME_PHASE = {
    "run.completed": "child.completed",
    "run.failed": "child.failed",
    "run.cancelled": "child.cancelled",
}


class HandoffError(AgentlogError):
    """A caller misused the handoff API (unknown mode, link joined with another run's event).

    This is a bug in the calling processor, never in the events: fix the call.
    """

    code = "handoff_error"


def derived_event_id(parent_run_id: str, decided_event_id: str, worker_id: str, phase: str) -> str:
    """Deterministic eventId of a derived transition, so every refold mints the same id."""
    return str(uuid.uuid5(NAMESPACE, f"{parent_run_id}/{decided_event_id}/{worker_id}/{phase}"))


# --------------------------------------------------------------------------- draft


class _Draft:
    """Copy-on-write view of a run state: copies a sub-container only on first write."""

    __slots__ = ("state", "outputs", "_copied")

    def __init__(self, base: State) -> None:
        self.state = dict(base)
        self.outputs: list[Output] = []
        self._copied: set[str] = set()

    def sub(self, key: str) -> Any:
        if key not in self._copied:
            self.state[key] = self.state[key].copy()
            self._copied.add(key)
        return self.state[key]

    def done(self) -> tuple[State, list[Output]]:
        return self.state, self.outputs


def _violation(
    draft: _Draft,
    event: Mapping[str, Any],
    code: str,
    detail: str,
    *,
    worker_id: str | None = None,
    phase: str | None = None,
    dispatch_id: str | None = None,
) -> None:
    """Report a violation as a value and flag the run (the flag is part of the state)."""
    draft.outputs.append({
        "kind": "violation",
        **violation(
            run_id=event.get("runId"), code=code, detail=detail, event_id=event.get("eventId"),
            sequence=event.get("sequence"), worker_id=worker_id, phase=phase, dispatch_id=dispatch_id,
        ),
    })
    draft.sub("flags").append({"code": code, "eventId": event.get("eventId"), "sequence": event.get("sequence")})


def _transition(phase: str, **fields: Any) -> Output:
    """The fold output for one transition of ``phase``; its from/to are the phase's row of :data:`PHASES`.

    ``fields`` are :func:`agentlog.schemas.records.transition`'s other arguments.
    """
    row = PHASES[phase]
    return {"kind": "transition", **transition(phase=phase, from_state=row.source, to_state=row.target, **fields)}


def _payload(event: Mapping[str, Any]) -> dict[str, Any]:
    p = event.get("payload")
    return p if isinstance(p, dict) else {}


def _nonempty_str(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value)


# --------------------------------------------------------------------------- decisions


def _decision_workers(decision: Mapping[str, Any]) -> list[str]:
    ids = decision.get("nextWorkerIds")
    if isinstance(ids, list):
        return [w for w in ids if _nonempty_str(w)]
    single = decision.get("nextWorkerId")
    return [single] if _nonempty_str(single) else []


def _normalize_mapping(mapping: Any, workers: list[str]) -> dict[str, dict[str, str]]:
    """``{workerId: {childKey: parentKey}}`` from either accepted shape.

    Per-worker when every value is an object, otherwise flat (applies to every
    named worker); non-string parent keys are dropped.
    """
    if not isinstance(mapping, dict) or not mapping:
        return {}
    if all(isinstance(v, dict) for v in mapping.values()):
        out = {}
        for worker, per in mapping.items():
            clean = {k: v for k, v in per.items() if _nonempty_str(v)}
            if clean and worker in workers:
                out[worker] = clean
        return out
    flat = {k: v for k, v in mapping.items() if _nonempty_str(v)}
    return {w: flat for w in workers} if flat else {}


def record_decision(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    """Remember which workers a decision named (and their output mappings).

    Both modes need it: check mode verifies ``dispatch.began`` causation against it,
    derive mode uses it as the cause of the derived ``dispatch.began``.
    """
    decision = _payload(event).get("decision")
    if not isinstance(decision, dict):
        decision = {}
    workers = _decision_workers(decision)
    event_id = event["eventId"]
    draft = _Draft(state)
    draft.sub("decisions")[event_id] = {
        "workerIds": workers,
        "outputMapping": _normalize_mapping(decision.get("outputMapping"), workers),
    }
    if workers:
        last = draft.sub("lastDecision")
        for worker in workers:
            last[worker] = event_id
    return draft.done()


# --------------------------------------------------------------------------- check mode


def check_chain_event(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    """Verify one host-emitted ``core.workflowChain.event`` and apply it if legal.

    Rules (CONTRACT.md "Handoff checking"): an illegal transition or a bad payload
    leaves the machine unchanged; a legal transition with the wrong causationId is
    applied *and* reported, because the host's state machine did move and the
    following events will chain from this one.
    """
    draft = _Draft(state)
    p = _payload(event)
    phase, worker = p.get("phase"), p.get("workerId")
    if not _nonempty_str(phase) or not _nonempty_str(worker) or p.get("parentRunId") != event.get("runId"):
        _violation(
            draft,
            event,
            "invalid_chain_payload",
            "core.workflowChain.event needs string phase and workerId and parentRunId equal to the event's runId",
            worker_id=worker if _nonempty_str(worker) else None,
            phase=phase if _nonempty_str(phase) else None,
        )
        return draft.done()
    row = PHASES.get(phase)
    if row is None:
        _violation(
            draft, event, "unknown_phase", f"phase {phase!r} is not an RFC 0037 phase", worker_id=worker, phase=phase,
        )
        return draft.done()

    # The host speaks for this worker under its latest decision: auto mode stops deriving it.
    decided = state["lastDecision"].get(worker)
    if worker not in state["hostChain"] or state["hostChain"][worker] != decided:
        draft.sub("hostChain")[worker] = decided
    if phase == "dispatch.began":
        _check_began(draft, state, event, worker)
    else:
        _check_later_phase(draft, state, event, p, phase, row, worker)
    return draft.done()


def _check_began(draft: _Draft, state: State, event: Mapping[str, Any], worker: str) -> None:
    event_id = event["eventId"]
    if event_id in state["handoffs"]:
        _violation(
            draft, event, "illegal_transition", "a machine with this dispatchId already began",
            worker_id=worker, phase="dispatch.began", dispatch_id=event_id,
        )
        return
    cause = event.get("causationId")
    decision = state["decisions"].get(cause) if cause is not None else None
    decided_event_id = cause
    if decision is None or worker not in decision["workerIds"]:
        detail = (
            f"dispatch.began must be caused by a runOrchestrator.decided naming {worker!r}; causationId is {cause!r}"
        )
        _violation(
            draft, event, "wrong_causation", detail, worker_id=worker, phase="dispatch.began", dispatch_id=event_id,
        )
        if decision is None:
            decided_event_id = state["lastDecision"].get(worker)
    draft.sub("handoffs")[event_id] = {
        "workerId": worker,
        "state": "dispatching",
        "childRunId": None,
        "lastEventId": event_id,
        "decidedEventId": decided_event_id,
        "derived": False,
    }
    draft.sub("lastDispatch")[worker] = event_id
    draft.outputs.append(
        _transition(
            parent_run_id=event["runId"], worker_id=worker, dispatch_id=event_id, child_run_id=None,
            phase="dispatch.began", event_id=event_id, causation_id=cause, sequence=event.get("sequence"),
            derived=False, timestamp=event.get("timestamp"),
        )
    )


def _check_later_phase(
    draft: _Draft,
    state: State,
    event: Mapping[str, Any],
    p: dict[str, Any],
    phase: str,
    row: Phase,
    worker: str,
) -> None:
    cause = event.get("causationId")
    handoffs = state["handoffs"]
    # A began's eventId is its dispatchId, so only later phases need the chainEvents index.
    if cause in handoffs and not handoffs[cause]["derived"]:
        dispatch_id = cause
    else:
        dispatch_id = state["chainEvents"].get(cause) if cause is not None else None
    if dispatch_id is not None and handoffs[dispatch_id]["workerId"] != worker:
        dispatch_id = None  # causation points into another worker's machine: not ours
    if dispatch_id is None:
        dispatch_id = state["lastDispatch"].get(worker)
        if dispatch_id is None:
            _violation(
                draft, event, "unknown_dispatch", f"no dispatch.began for worker {worker!r} in this run",
                worker_id=worker, phase=phase,
            )
            return
    machine = handoffs[dispatch_id]
    if machine["state"] != row.source:
        _violation(
            draft, event, "illegal_transition",
            f"{phase} needs state {row.source!r}, machine is {machine['state']!r}",
            worker_id=worker, phase=phase, dispatch_id=dispatch_id,
        )
        return

    child_run_id = p.get("childRunId")
    if phase == "dispatch.succeeded":
        if not _nonempty_str(child_run_id):
            _violation(
                draft, event, "invalid_chain_payload", "dispatch.succeeded must carry childRunId",
                worker_id=worker, phase=phase, dispatch_id=dispatch_id,
            )
            return
    elif child_run_id is not None and child_run_id != machine["childRunId"]:
        _violation(
            draft, event, "invalid_chain_payload",
            f"childRunId {child_run_id!r} differs from the dispatched child {machine['childRunId']!r}",
            worker_id=worker, phase=phase, dispatch_id=dispatch_id,
        )
        return
    else:
        child_run_id = machine["childRunId"]

    harvested = None
    if phase == "output.harvested":
        harvested = p.get("harvestedKeys")
        if not isinstance(harvested, list) or not harvested:
            _violation(
                draft, event, "harvest_without_mapping", "output.harvested without non-empty harvestedKeys",
                worker_id=worker, phase=phase, dispatch_id=dispatch_id,
            )
            return

    if cause != machine["lastEventId"] and not _nonempty_str(p.get("causationHostId")):
        _violation(
            draft, event, "wrong_causation",
            f"{phase} must be caused by the machine's previous transition {machine['lastEventId']!r}; "
            f"causationId is {cause!r}",
            worker_id=worker, phase=phase, dispatch_id=dispatch_id,
        )

    event_id = event["eventId"]
    draft.sub("handoffs")[dispatch_id] = {
        **machine, "state": row.target, "childRunId": child_run_id, "lastEventId": event_id,
    }
    draft.sub("chainEvents")[event_id] = dispatch_id
    draft.outputs.append(
        _transition(
            parent_run_id=event["runId"], worker_id=worker, dispatch_id=dispatch_id, child_run_id=child_run_id,
            phase=phase, event_id=event_id, causation_id=cause, sequence=event.get("sequence"), derived=False,
            timestamp=event.get("timestamp"), harvested_keys=harvested,
            error=p.get("error") if phase in ("dispatch.failed", "child.failed", "child.cancelled") else None,
        )
    )


# --------------------------------------------------------------------------- derive mode


def derive_dispatch(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    """On ``node.dispatched``, derive ``dispatch.began`` then ``dispatch.succeeded`` or ``dispatch.failed``.

    ``auto`` derives only while the host has emitted no chain event for this worker
    since the latest decision naming it; ``check`` never derives; ``derive`` always does.
    """
    if mode == "check":
        return state, []
    if mode not in HANDOFF_MODES:
        raise HandoffError(f"handoff_mode must be one of {sorted(HANDOFF_MODES)}, not {mode!r}")
    p = _payload(event)
    worker, child_run_id = p.get("childWorkflowId"), p.get("childRunId")
    if not _nonempty_str(worker) or not _nonempty_str(child_run_id):
        return state, []  # nothing to derive from; the payload model rejects this upstream anyway
    decided = state["lastDecision"].get(worker)
    if mode == "auto" and worker in state["hostChain"] and state["hostChain"][worker] == decided:
        return state, []

    draft = _Draft(state)
    parent = event["runId"]
    if decided is None:
        _violation(
            draft, event, "unknown_dispatch",
            f"node.dispatched for worker {worker!r} that no runOrchestrator.decided named",
            worker_id=worker, phase="dispatch.began",
        )
        return draft.done()
    began_id = derived_event_id(parent, decided, worker, "dispatch.began")
    if began_id in state["handoffs"]:
        _violation(
            draft, event, "illegal_transition",
            f"worker {worker!r} was already dispatched for decision {decided!r}",
            worker_id=worker, phase="dispatch.began", dispatch_id=began_id,
        )
        return draft.done()

    ts = event.get("timestamp")
    common = {
        "parent_run_id": parent, "worker_id": worker, "dispatch_id": began_id, "sequence": None, "derived": True,
        "timestamp": ts,
    }
    draft.outputs.append(
        _transition(**common, child_run_id=None, phase="dispatch.began", event_id=began_id, causation_id=decided)
    )
    status = p.get("childStatus")
    if isinstance(status, str) and status in FAILED_CHILD_STATUSES:
        failed_id = derived_event_id(parent, decided, worker, "dispatch.failed")
        error = {"code": "dispatch_failed", "message": f"child run was not created (childStatus {status!r})"}
        draft.outputs.append(
            _transition(
                **common, child_run_id=None, phase="dispatch.failed", event_id=failed_id, causation_id=began_id,
                error=error,
            )
        )
        machine_state, last_id, child = "failed", failed_id, None
    else:
        ok_id = derived_event_id(parent, decided, worker, "dispatch.succeeded")
        draft.outputs.append(
            _transition(
                **common, child_run_id=child_run_id, phase="dispatch.succeeded", event_id=ok_id, causation_id=began_id,
            )
        )
        mapping = state["decisions"][decided]["outputMapping"].get(worker, {})
        draft.outputs.append(
            {
                "kind": "link",
                "parentRunId": parent,
                "workerId": worker,
                "dispatchId": began_id,
                "childRunId": child_run_id,
                "succeededEventId": ok_id,
                "harvestKeys": sorted(set(mapping.values())),
                "decidedEventId": decided,
            }
        )
        machine_state, last_id, child = "running", ok_id, child_run_id
    draft.sub("handoffs")[began_id] = {
        "workerId": worker,
        "state": machine_state,
        "childRunId": child,
        "lastEventId": last_id,
        "decidedEventId": decided,
        "derived": True,
    }
    return draft.done()


def derive_child_outcome(link: Mapping[str, Any], child_event: Mapping[str, Any]) -> list[Output]:
    """The transitions a child's terminal ``run.*`` event completes for a derived dispatch.

    Returns ``[]`` for a non-terminal child event, so a joiner can pass every child
    event through. ``child.completed`` is followed by ``output.harvested`` only when
    the worker's outputMapping was non-empty (``link["harvestKeys"]``).

    Raises:
        HandoffError: the event belongs to another run than ``link["childRunId"]``.
    """
    phase = _CHILD_OUTCOME_PHASE.get(child_event.get("type"))  # type: ignore[arg-type]
    if phase is None:
        return []
    if child_event.get("runId") != link["childRunId"]:
        raise HandoffError(
            f"link for child {link['childRunId']!r} joined with an event of run {child_event.get('runId')!r}"
        )
    parent, decided, worker = link["parentRunId"], link["decidedEventId"], link["workerId"]
    common = {
        "parent_run_id": parent, "worker_id": worker, "dispatch_id": link["dispatchId"],
        "child_run_id": link["childRunId"], "sequence": None, "derived": True,
        "timestamp": child_event.get("timestamp"),
    }
    outcome_id = derived_event_id(parent, decided, worker, phase)
    error = None
    if phase != "child.completed":
        p = _payload(child_event)
        error = p.get("error") if isinstance(p.get("error"), dict) else {
            "code": "child_" + phase.split(".")[1], "message": f"child run ended with {child_event.get('type')}",
        }
    out = [_transition(**common, phase=phase, event_id=outcome_id, causation_id=link["succeededEventId"], error=error)]
    keys = list(link.get("harvestKeys") or [])
    if phase == "child.completed" and keys:
        out.append(
            _transition(
                **common, phase="output.harvested",
                event_id=derived_event_id(parent, decided, worker, "output.harvested"),
                causation_id=outcome_id, harvested_keys=sorted(keys),
            )
        )
    return out


# --- derive mode: join a dispatch with its child run's outcome (handoff-links topic) ---

#: A handoff-links message: ``{"kind": "link", "link": <link output without kind>}`` or
#: ``{"kind": "child-terminal", "event": <the child's terminal RunEventDoc>}``, decoded from JSON.
LinksMessage = Mapping[str, Any]
#: A child run's join record (the ``links`` table): ``{"link", "terminal", "done"}``.
JoinRecord = dict[str, Any]


def join(record: Mapping[str, Any] | None, message: LinksMessage) -> tuple[JoinRecord, list[Transition]]:
    """Fold one handoff-links message into the child's join record; pure.

    Returns the new record and the derived transitions, without the fold's ``kind`` tag, as
    the transitions topic holds them (empty until both sides are known).
    """
    rec: JoinRecord = dict(record or {"link": None, "terminal": None, "done": False})
    if message.get("kind") == "link":
        rec["link"] = message["link"]
    elif message.get("kind") == "child-terminal":
        rec["terminal"] = message["event"]
    if rec["done"] or rec["link"] is None or rec["terminal"] is None:
        return rec, []
    rec["done"] = True
    transitions = [
        cast(Transition, {k: v for k, v in t.items() if k != "kind"})
        for t in derive_child_outcome(rec["link"], rec["terminal"])
    ]
    return rec, transitions


def child_of(message: LinksMessage) -> str:
    """The childRunId a handoff-links message is about (its Kafka key, read from the value)."""
    # Both are strings as produced: a link's childRunId passed _nonempty_str in derive_dispatch,
    # a terminal event is a committed (validated) doc.
    child_run_id: str = (
        message["link"]["childRunId"] if message.get("kind") == "link" else message["event"]["runId"]
    )
    return child_run_id
