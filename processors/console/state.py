"""The state slider's data: a run's observable state at one index, from the one fold.

The console never interprets events itself (STYLE §2): it folds the run's events with
:func:`agentlog.core.fold.fold` up to the chosen index, exactly as the live worker and
replay do. The fold is copy-on-write, so what an event changed is found by identity: a
sub-dict or value the event did not touch is the very same object before and after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentlog.core.fold import FoldError, fold

__all__ = ["StateView", "run_state", "state_at"]

#: The parts of the fold's state the slider shows (SPEC §6 observable state plus the handoff machines).
SHOWN = ("variables", "channels", "handoffs")


@dataclass(frozen=True, kw_only=True)
class StateView:
    """The state after the event at ``index`` (0-based position in the run, = its sequence in a gap-free run).

    ``changed`` names what that event changed: ``status``, or ``<part>.<key>`` such as ``variables.goal``.
    """

    index: int
    count: int
    sequence: int | None
    event_type: str | None
    status: str
    parts: dict[str, Mapping[str, Any]]
    changed: frozenset[str]


def state_at(events: Sequence[Mapping[str, Any]], index: int) -> StateView:
    """Fold ``events`` (in sequence order) through ``index`` (clamped to the run) and say what the last one changed.

    Raises:
        FoldError: ``events`` is empty (nothing to fold).
    """
    return _fold(events, index, to_end=False)[0]


def run_state(events: Sequence[Mapping[str, Any]], index: int) -> tuple[StateView, str]:
    """:func:`state_at` and the run's status after its last event, from one pass of the fold.

    Raises:
        FoldError: ``events`` is empty (nothing to fold).
    """
    return _fold(events, index, to_end=True)


def _fold(events: Sequence[Mapping[str, Any]], index: int, *, to_end: bool) -> tuple[StateView, str]:
    index = max(0, min(index, len(events) - 1))
    state: Any = None
    previous: Any = None
    at: tuple[Any, Any] = (None, None)
    for i, event in enumerate(events):
        previous = state
        state, _ = fold(state, event)
        if i == index:
            at = (previous, state)
            if not to_end:
                break
    if state is None:
        raise FoldError("a run with no events has no state to show")
    previous, state_then = at
    changed: set[str] = set()
    if previous is None or previous["status"] != state_then["status"]:
        changed.add("status")
    for part in SHOWN:
        before: Mapping[str, Any] = previous[part] if previous is not None else {}
        after: Mapping[str, Any] = state_then[part]
        if before is after:
            continue
        for key, value in after.items():
            if key not in before or before[key] is not value:
                changed.add(f"{part}.{key}")
        changed.update(f"{part}.{key}" for key in before if key not in after)
    event = events[index]
    view = StateView(index=index, count=len(events), sequence=event.get("sequence"), event_type=event.get("type"),
                     status=state_then["status"], parts={part: state_then[part] for part in SHOWN},
                     changed=frozenset(changed))
    return view, str(state["status"])
