"""A re-derivation walk over decoded log records, and what two walks are compared on (shared by the walk tests)."""

from __future__ import annotations

from typing import Any

from agentlog.replay.rederive import _Walk
from agentlog.schemas.canonical import GENESIS


def new_walk(*, collect_all: bool = True) -> _Walk:
    """A walk from the start of a run (no snapshot, no digests read up front), handoff checks on."""
    return _Walk(state=None, head=GENESIS, next_seq=0, collect_all=collect_all, digests={}, snapshots={},
                 handoff_mode="check")


def walk_records(records: list[dict[str, Any]], *, collect_all: bool = True, usual: bool = True) -> _Walk:
    """Every record through ``_Walk.record`` in order; ``usual=False``: the general path only."""
    walk = new_walk(collect_all=collect_all)
    if not usual:
        walk._usual = lambda *args: False  # type: ignore[method-assign]
    for offset, record in enumerate(records):
        walk.record(offset, record)
    return walk


def walk_summary(walk: _Walk) -> dict[str, Any]:
    """Everything a walk ends with that a verdict or a report is built from."""
    return {"divergences": [d.to_dict() for d in walk.divergences], "compared": walk.compared,
            "events": walk.events, "head": walk.head, "next_seq": walk.next_seq, "state": walk.state,
            "seen": walk.seen, "state_diverged": walk.state_diverged, "state_blind": walk.state_blind,
            "conflicts": walk.conflicts}
