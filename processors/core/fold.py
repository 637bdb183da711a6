"""The one fold: ``(state, event) -> (state, outputs)``, shared by every reader of a run.

The live processors, snapshots, replay and any rebuild call this same function,
so "same events in, same bytes out" holds by construction (SPEC §6). It is pure:
no I/O, no clock, no randomness, and it never mutates its input. States share
structure with their predecessors (copy-on-write of only the sub-dicts an event
changes), which is what makes folding at every index affordable; the price is
that callers must treat every state as read-only.

Unknown or opaque event types leave the state unchanged (the same object): the
event contract is open, and a reader that throws on a new type would stop a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentlog.core.handoff import (
    CHAIN_EVENT,
    HANDOFF_MODES,
    HandoffError,
    Output,
    State,
    check_chain_event,
    derive_dispatch,
    record_decision,
)
from agentlog.schemas.canonical import jcs, sha256_hex
from agentlog.schemas.errors import AgentlogError

__all__ = [
    "OBSERVABLE_KEYS",
    "FoldError",
    "STATUSES",
    "fold",
    "fold_all",
    "fold_noting",
    "initial_state",
    "observable",
    "state_hash",
    "states_by_index",
]

#: SPEC §6 run statuses. ``waiting-external`` and ``cancelling`` are valid values
#: that no event type we interpret sets yet.
STATUSES = (
    "pending", "running", "paused", "waiting-approval", "waiting-input",
    "waiting-external", "completed", "failed", "cancelling", "cancelled",
)

#: The part of the state replay compares between a run and its re-execution.
OBSERVABLE_KEYS = ("status", "variables", "channels")

class FoldError(AgentlogError):
    """The fold was called with nothing to fold (no events and no starting state): a caller bug."""

    code = "fold_error"


Handler = Callable[[State, Mapping[str, Any], str], tuple[State, list[Output]]]


def initial_state(run_id: str) -> State:
    """State before the run's first event; ``run_id`` is accepted for symmetry, not stored.

    Keeping the run id out of the state lets a run and its host replay (another runId)
    reach equal state where their observable parts agree.
    """
    return {
        "status": "pending",
        "variables": {},
        "channels": {},
        "handoffs": {},
        "bindings": {},
        "flags": [],
        "replayOf": None,
        "decisions": {},
        "lastDecision": {},
        "lastDispatch": {},
        "chainEvents": {},
        "hostChain": {},
    }


def state_hash(state: Mapping[str, Any]) -> str:
    """``sha256(JCS(state))``.

    Independent of dict insertion order, so a state loaded from a snapshot hashes the same.
    """
    return sha256_hex(jcs(state))


def observable(state: Mapping[str, Any]) -> dict[str, Any]:
    """The observable state (SPEC §6) replay compares byte for byte."""
    return {"status": state["status"], "variables": state["variables"], "channels": state["channels"]}


def fold(state: State | None, event: Mapping[str, Any], *, handoff_mode: str = "auto") -> tuple[State, list[Output]]:
    """Apply one validated RunEventDoc; return the new state and its outputs.

    Outputs are ``transition`` / ``violation`` / ``link`` dicts (CONTRACT.md). ``handoff_mode``
    only matters for ``node.dispatched``: ``check`` never derives transitions, ``derive``
    always does, ``auto`` derives unless the host already emits chain events for that
    worker under its latest decision.

    Raises:
        HandoffError: ``handoff_mode`` is not one of check/derive/auto (a caller bug;
            events never make the fold raise).
    """
    if state is None:
        state = initial_state(event["runId"])
    handler = _HANDLERS.get(event.get("type"))  # type: ignore[arg-type]
    if handler is None:
        return state, []
    return handler(state, event, handoff_mode)


def fold_noting(
    state: State | None, event: Mapping[str, Any], *, handoff_mode: str = "auto"
) -> tuple[State, list[Output], tuple[str, str] | None]:
    """:func:`fold`, and ``(member, key)`` when all the event did was set ``state[member][key]``.

    For re-derivation's state check: with the key the event set, the candidate
    state hash re-spells that one entry instead of the whole member and finding what changed
    (:meth:`agentlog.core.statehash.ResumableStateHash.after_set`). ``None`` for every other
    event. The state is :func:`fold`'s own: the note is only *about* it. A note is given for
    ``variable.changed`` when :func:`_variable_changed` changed the state: it copies the state and
    the variables and sets the one variable (``tests/unit/core/test_fold_noting.py`` holds every note
    to that over random histories, so a handler that starts to change more fails there).
    """
    if state is None or _HANDLERS.get(event.get("type")) is not _variable_changed:  # type: ignore[arg-type]
        new, outputs = fold(state, event, handoff_mode=handoff_mode)
        return new, outputs, None
    new, outputs = _variable_changed(state, event, handoff_mode)  # what fold() calls for it, dispatched once
    return new, outputs, None if new is state else ("variables", _payload(event)["name"])


def fold_all(
    events: Iterable[Mapping[str, Any]], *, handoff_mode: str = "auto", state: State | None = None
) -> tuple[State, list[Output]]:
    """Fold a run's events in order (optionally from a snapshot ``state``); all outputs concatenated."""
    _check_mode(handoff_mode)
    outputs: list[Output] = []
    for event in events:
        state, out = fold(state, event, handoff_mode=handoff_mode)
        if out:
            outputs.extend(out)
    if state is None:
        raise FoldError("fold_all needs at least one event or a starting state")
    return state, outputs


def states_by_index(events: Iterable[Mapping[str, Any]], *, handoff_mode: str = "auto") -> list[tuple[State, str]]:
    """``(state, stateHash)`` after each event, in order: the per-index digests of SPEC §6."""
    _check_mode(handoff_mode)
    result: list[tuple[State, str]] = []
    state: State | None = None
    for event in events:
        state, _ = fold(state, event, handoff_mode=handoff_mode)
        result.append((state, state_hash(state)))
    return result


def _check_mode(mode: str) -> None:
    if mode not in HANDOFF_MODES:
        raise HandoffError(f"handoff_mode must be one of {sorted(HANDOFF_MODES)}, not {mode!r}")


# --------------------------------------------------------------------------- handlers


def _payload(event: Mapping[str, Any]) -> Mapping[str, Any]:
    p = event.get("payload")
    return p if isinstance(p, dict) else {}


def _to_status(status: str) -> Handler:
    def handler(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
        if state["status"] == status:
            return state, []
        new = dict(state)
        new["status"] = status
        return new, []

    handler.__name__ = f"to_{status.replace('-', '_')}"
    return handler


def _run_started(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    """Bind versions (MACP §3) and remember what this run replays, so replay can tell match from what-if."""
    p = _payload(event)
    bindings = p.get("bindings")
    replay_of = p.get("replayOf")
    new = dict(state)
    new["status"] = "running"
    new["bindings"] = dict(bindings) if isinstance(bindings, dict) else {}
    if isinstance(replay_of, dict):
        new["replayOf"] = dict(replay_of)
    return new, []


def _variable_changed(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    p = _payload(event)
    name = p.get("name")
    if not isinstance(name, str) or "value" not in p:
        return state, []
    variables = dict(state["variables"])
    variables[name] = p["value"]
    new = dict(state)
    new["variables"] = variables
    return new, []


def _channel_written(state: State, event: Mapping[str, Any], mode: str) -> tuple[State, list[Output]]:
    """A channel keeps every value written to it, in order: a channel is a stream, not a slot."""
    p = _payload(event)
    channel = p.get("channel")
    if not isinstance(channel, str) or "value" not in p:
        return state, []
    channels = dict(state["channels"])
    channels[channel] = [*channels.get(channel, ()), p["value"]]
    new = dict(state)
    new["channels"] = channels
    return new, []


_STATUS_BY_TYPE = {
    "run.paused": "paused",
    "run.resumed": "running",
    "run.resuming": "running",
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "approval.requested": "waiting-approval",
    "approval.granted": "running",
    "approval.received": "running",
    "approval.rejected": "running",
    "clarification.requested": "waiting-input",
    "clarification.resolved": "running",
}

_HANDLERS: dict[str, Handler] = {
    **{event_type: _to_status(status) for event_type, status in _STATUS_BY_TYPE.items()},
    "run.started": _run_started,
    "variable.changed": _variable_changed,
    "channel.written": _channel_written,
    "runOrchestrator.decided": record_decision,
    CHAIN_EVENT: check_chain_event,
    "node.dispatched": derive_dispatch,
}
