"""Lanes: which differences between a run and its replay are only scheduling.

Concurrent workers append to one run log in whatever order the scheduler lets them, so a
faithful replay may interleave them differently. Index-by-index comparison (RFC 0041 §C, the
seeds' single sequential host) calls the first swapped index a divergence; that is a false
alarm of the same kind as a changed timestamp. A *lane* is what must stay ordered: the events of
one node, and within the dispatch node one worker's dispatch (``payload.workerId`` /
``childWorkflowId``). Child runs are lanes of their own by construction — they are other runs,
compared by :mod:`processors.replay.tree`.

:func:`align` pairs the k-th event of a lane in the original with the k-th event of the same
lane in the replay. The comparison engine then compares the replay *re-laid in the original's
order* (each paired replay event at its source sequence), so every existing check — event
fields, refusals, causation through the id pairing, volatile fields, bindings — runs unchanged
and a real divergence is reported at the source run's sequence of the first differing event
within its lane. What the re-laying could hide is checked on the replay's own order: the whole
observable state at every lane join (:data:`JOIN_TYPES`, where lanes meet again) and at the
end must equal the original's there.

Cross-lane order constrained by causation needs no check of its own: an event's cause is
compared through the pairing (the replay event must be caused by the partner of the
original's cause), so a replay that broke a causal order diverges on ``causationId``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["JOIN_TYPES", "Alignment", "align", "lane_of"]

#: Run-level status events: every lane has ended or waits here, so the whole state is defined
#: independently of interleaving (as it is after the last event).
JOIN_TYPES = frozenset({"run.started", "run.completed", "run.failed", "run.cancelled", "run.paused", "run.resumed"})

#: Payload fields naming the worker a dispatch-node event is about (handoff chain, node.dispatched).
_WORKER_FIELDS = ("workerId", "childWorkflowId")


def lane_of(doc: Mapping[str, Any]) -> str:
    """The lane an event belongs to: its node, refined by the worker for dispatch events."""
    payload = doc.get("payload")
    node = doc.get("nodeId")
    if node is None and isinstance(payload, Mapping):
        node = payload.get("nodeId")
    lane = node if isinstance(node, str) else ""
    if isinstance(payload, Mapping):
        for name in _WORKER_FIELDS:
            worker = payload.get(name)
            if isinstance(worker, str):
                return f"{lane}/{worker}"
    return lane


@dataclass(frozen=True)
class Alignment:
    """Original sequence → replay sequence for every paired event, plus what has no partner.

    ``extra`` keeps the replay's order; an unpaired original index is simply absent from
    ``pairs`` (the engine reports it ``missing``).
    """

    pairs: dict[int, int]
    extra: tuple[int, ...]

    @property
    def identity(self) -> bool:
        """True when the lanes change nothing: index comparison is already lane comparison."""
        return not self.extra and all(o == r for o, r in self.pairs.items())

    def relaid(self, original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]]
               ) -> dict[int, Mapping[str, Any]]:
        """The replay's events at their partners' source sequences; extras after the original's end."""
        out: dict[int, Mapping[str, Any]] = {}
        for o_seq in original:
            r_seq = self.pairs.get(o_seq)
            if r_seq is not None:
                out[o_seq] = {**replay[r_seq], "sequence": o_seq}
        tail = max(original) + 1
        for n, r_seq in enumerate(self.extra):
            out[tail + n] = {**replay[r_seq], "sequence": tail + n}
        return out

    def reordered(self, original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]]
                  ) -> list[dict[str, Any]]:
        """The paired events that sit at another index in the replay (what the interleaving moved).

        A pair of different event types is not a moved event but a divergence; it is left out.
        """
        return [
            {"atSequence": o_seq, "replaySequence": r_seq, "lane": lane_of(original[o_seq]),
             "type": original[o_seq].get("type")}
            for o_seq, r_seq in sorted(self.pairs.items())
            if o_seq != r_seq and original[o_seq].get("type") == replay[r_seq].get("type")
        ]


def align(original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]]) -> Alignment:
    """Pair events lane by lane, in order (both mappings iterate in sequence order)."""
    o_lanes: dict[str, list[int]] = {}
    r_lanes: dict[str, list[int]] = {}
    for seq, doc in original.items():
        o_lanes.setdefault(lane_of(doc), []).append(seq)
    for seq, doc in replay.items():
        r_lanes.setdefault(lane_of(doc), []).append(seq)
    pairs: dict[int, int] = {}
    extra: list[int] = []
    for lane, r_seqs in r_lanes.items():
        o_seqs = o_lanes.get(lane, [])
        pairs.update(zip(o_seqs, r_seqs, strict=False))
        extra.extend(r_seqs[len(o_seqs):])
    return Alignment(pairs=dict(sorted(pairs.items())), extra=tuple(sorted(extra)))
