"""Lanes: which differences between a run and its replay are only scheduling.

Concurrent workers append to one run log in whatever order the scheduler lets them, so a
faithful replay may interleave them differently. Index-by-index comparison (RFC 0041 §C, the
seeds' single sequential host) calls the first swapped index a divergence; that is a false
alarm of the same kind as a changed timestamp. A *lane* is what must stay ordered: the events of
one node, and within the dispatch node one worker's dispatch (``payload.workerId`` /
``childWorkflowId``). Child runs are lanes of their own by construction — they are other runs,
compared by :mod:`agentlog.replay.tree`.

:func:`align` aligns each lane of the replay with the same lane of the original as a sequence
diff (:class:`difflib.SequenceMatcher`), coarser key by coarser key: events that are the same
event under the caller's ``key`` pair first (the comparison engine passes every field it
compares, volatile fields left out); what that leaves unpaired between two pairs is paired by
identity (:func:`identity_key`: type, node, and the names of what the event is about), then in
order. So an event changed in a compared field still pairs with its original and is judged
``output`` (or ``type-mismatch``, ``refusal``), while an event the replay inserted into its lane
has no partner (``extra``) and neither has one it left out (``missing``). Two cases skip or
override the diff. A lane whose events have the same identities in the same order on both sides
pairs event for event (nothing was inserted or removed; most lanes of most replays). An event
the diff would call removed in one place and inserted in another is the lane's order changing,
not an extra and a missing event: from there on the lane pairs in order, so the swap is reported
where it begins.

The comparison engine then compares the replay *re-laid in the original's order* (each paired
replay event at its source sequence), so every existing check — event fields, refusals, causation
through the id pairing, volatile fields, bindings — runs unchanged and a divergence is reported at
the source run's sequence of the first differing event within its lane. An inserted event is
reported where its lane departs from the source (:attr:`Alignment.departs`). Where the replay
interleaves the lanes differently from the source, other lanes' indexes say nothing of this one:
the lane departs at the source sequence of the lane event the insertion displaced, the lane's next
event. Where the replay keeps the source's interleaving, and at the end of a lane (nothing of it is
displaced), it departs at the first source sequence after its lane predecessor that the replay had
not yet reached when it wrote the event — in a sequential replay, exactly the index it was inserted
at, as index-by-index comparison says too. The run's terminal status does not count as not yet
reached: every lane ends before it in any interleaving, so an inserted event at the end of its lane
that only the terminal status follows departs after the lane's end and is laid after the
original's end. What the re-laying
could hide is checked on the replay's own order: the whole observable state at every lane join
(:data:`JOIN_TYPES`, where lanes meet again) and at the end must equal the original's there.

Cross-lane order constrained by causation needs no check of its own: an event's cause is
compared through the pairing (the replay event must be caused by the partner of the
original's cause), so a replay that broke a causal order diverges on ``causationId``.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

__all__ = ["JOIN_TYPES", "PAYLOAD_NAMES", "TERMINAL_TYPES", "Alignment", "align", "identity_key", "lane_of"]

#: Run-level status events: every lane has ended or waits here, so the whole state is defined
#: independently of interleaving (as it is after the last event).
JOIN_TYPES = frozenset({"run.started", "run.completed", "run.failed", "run.cancelled", "run.paused", "run.resumed"})

#: The joins that end a run: no lane continues after them.
TERMINAL_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})

#: Payload fields naming the worker a dispatch-node event is about (handoff chain, node.dispatched).
_WORKER_FIELDS = ("workerId", "childWorkflowId")

#: Payload fields naming what an event is about: the variable, channel, tool, handoff phase, worker
#: or agent. Two events of one type and node that name the same things are the same event changed.
_IDENTITY_FIELDS = ("name", "channel", "tool", "phase", "workerId", "childWorkflowId", "agentId")

#: Every payload field :func:`lane_of` and :func:`identity_key` read; only string values count.
PAYLOAD_NAMES = tuple(dict.fromkeys(("nodeId", *_WORKER_FIELDS, *_IDENTITY_FIELDS)))

Key = Callable[[Mapping[str, Any]], Hashable]


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


def identity_key(doc: Mapping[str, Any]) -> Hashable:
    """Type, node, and the names of what the event is about (:data:`_IDENTITY_FIELDS`), not its values."""
    payload = doc.get("payload")
    if not isinstance(payload, Mapping):
        return doc.get("type"), doc.get("nodeId")
    names = tuple(value if isinstance(value := payload.get(f), str) else None for f in _IDENTITY_FIELDS)
    return doc.get("type"), doc.get("nodeId"), names


@dataclass(frozen=True)
class Alignment:
    """Original sequence → replay sequence for every paired event, plus what has no partner.

    ``extra`` keeps the replay's order; an unpaired original index is simply absent from
    ``pairs`` (the engine reports it ``missing``). ``departs`` gives, for an extra replay event,
    the source sequence where its lane departs from the original; an extra without one departs
    after the lane's end and is laid after the original's end.
    """

    pairs: dict[int, int]
    extra: tuple[int, ...]
    departs: dict[int, int] = field(default_factory=dict)

    @property
    def identity(self) -> bool:
        """True when the lanes change nothing: index comparison is already lane comparison."""
        return not self.extra and all(o == r for o, r in self.pairs.items())

    def inserted(self) -> dict[int, tuple[int, ...]]:
        """Source sequence → the extra replay events departing there, in the replay's order."""
        out: dict[int, list[int]] = {}
        for r_seq in self.extra:
            if r_seq in self.departs:
                out.setdefault(self.departs[r_seq], []).append(r_seq)
        return {o_seq: tuple(r_seqs) for o_seq, r_seqs in sorted(out.items())}

    def relaid(self, original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]]
               ) -> dict[int, Mapping[str, Any]]:
        """The replay's paired events at their partners' source sequences; extras that depart after
        their lane's end after the original's end (the others are reported where they depart)."""
        return {seq: {**replay[r_seq], "sequence": seq} for seq, r_seq in self.relaid_sequences(original).items()}

    def relaid_sequences(self, original: Mapping[int, Any]) -> dict[int, int]:
        """Where :meth:`relaid` lays each replay event: re-laid sequence → replay sequence, in sequence order."""
        out = {o_seq: r_seq for o_seq in original if (r_seq := self.pairs.get(o_seq)) is not None}
        tail = max(original) + 1
        for n, r_seq in enumerate(r for r in self.extra if r not in self.departs):
            out[tail + n] = r_seq
        return out

    def reordered(self, original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]]
                  ) -> list[dict[str, Any]]:
        """The paired events the interleaving moved: those at another rank among the paired events.

        Ranks, not sequences, so that the events after an extra or a missing one, shifted by it, do
        not count as moved. A pair of different event types is not a moved event but a
        divergence; it is left out.
        """
        replay_rank = {r_seq: rank for rank, r_seq in enumerate(sorted(self.pairs.values()))}
        return [
            {"atSequence": o_seq, "replaySequence": r_seq, "lane": lane_of(original[o_seq]),
             "type": original[o_seq].get("type")}
            for rank, (o_seq, r_seq) in enumerate(sorted(self.pairs.items()))
            if replay_rank[r_seq] != rank and original[o_seq].get("type") == replay[r_seq].get("type")
        ]


def align(original: Mapping[int, Mapping[str, Any]], replay: Mapping[int, Mapping[str, Any]], *,
          key: Key = identity_key) -> Alignment:
    """Align each lane of ``replay`` with the same lane of ``original`` (both iterate in sequence order).

    ``key`` says when two events of a lane are the same event; events it leaves unpaired are
    paired by :func:`identity_key`, then in order (see the module docstring).
    """
    o_lanes: dict[str, list[int]] = {}
    r_lanes: dict[str, list[int]] = {}
    for seq, doc in original.items():
        o_lanes.setdefault(lane_of(doc), []).append(seq)
    for seq, doc in replay.items():
        r_lanes.setdefault(lane_of(doc), []).append(seq)
    keys = (key,) if key is identity_key else (key, identity_key)
    pairs: dict[int, int] = {}
    inserts: list[tuple[int, int, int | None]] = []
    for lane, r_seqs in r_lanes.items():
        o_seqs = o_lanes.get(lane, [])
        lane_pairs, lane_inserts = _LaneDiff(
            [original[s] for s in o_seqs], [replay[s] for s in r_seqs], keys).result()
        pairs.update((o_seqs[i], r_seqs[j]) for i, j in lane_pairs)
        inserts.extend((r_seqs[j], o_seqs[before - 1] if before > 0 else -1,
                        o_seqs[before] if before < len(o_seqs) else None) for j, before in lane_inserts)
    extra = tuple(sorted(r_seq for r_seq, _, _ in inserts))
    return Alignment(pairs=dict(sorted(pairs.items())), extra=extra,
                     departs=_departures(original, pairs, inserts))


class _LaneDiff:
    """One lane's alignment, in lane positions: pairs (original, replay), and each unpaired replay
    event with the original lane position it sits just before."""

    def __init__(self, original: Sequence[Mapping[str, Any]], replay: Sequence[Mapping[str, Any]],
                 keys: tuple[Key, ...]) -> None:
        self.original, self.replay, self.keys = original, replay, keys
        self.pairs: list[tuple[int, int]] = []
        self.inserts: list[tuple[int, int]] = []

    def result(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        if len(self.original) == len(self.replay) and all(
                identity_key(o) == identity_key(r) for o, r in zip(self.original, self.replay, strict=True)):
            # Event for event the same identities: nothing inserted or removed, every event pairs
            # with its counterpart in order (the common case, without a key of every payload).
            self.pairs = [(i, i) for i in range(len(self.original))]
            return self.pairs, self.inserts
        self._diff(0, len(self.original), 0, len(self.replay), self.keys)
        self.pairs.sort()
        self.inserts.sort()
        moved_from = self._moved()
        if moved_from is not None:
            self._in_order_from(*moved_from)
        return self.pairs, self.inserts

    def _diff(self, o_lo: int, o_hi: int, r_lo: int, r_hi: int, keys: tuple[Key, ...]) -> None:
        if not keys:  # what no key pairs: in order, the surplus of either side unpaired
            common = min(o_hi - o_lo, r_hi - r_lo)
            self.pairs.extend((o_lo + k, r_lo + k) for k in range(common))
            self.inserts.extend((j, o_hi) for j in range(r_lo + common, r_hi))
            return
        key, coarser = keys[0], keys[1:]
        a = [key(doc) for doc in self.original[o_lo:o_hi]]
        b = [key(doc) for doc in self.replay[r_lo:r_hi]]
        # autojunk off: in a long lane the frequent keys (every call of one tool) are the events,
        # not noise to skip.
        for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag == "equal":
                self.pairs.extend((o_lo + i1 + k, r_lo + j1 + k) for k in range(i2 - i1))
            elif tag == "insert":
                self.inserts.extend((j, o_lo + i1) for j in range(r_lo + j1, r_lo + j2))
            elif tag == "replace":
                self._diff(o_lo + i1, o_lo + i2, r_lo + j1, r_lo + j2, coarser)

    def _moved(self) -> tuple[int, int] | None:
        """Where the lane's order changed: the first original and replay lane positions of an event
        the diff calls both removed (there) and inserted (elsewhere); ``None`` when none is."""
        key = self.keys[0]
        paired = {i for i, _ in self.pairs}
        removed: dict[Hashable, int] = {}
        for i, doc in enumerate(self.original):
            if i not in paired:
                removed.setdefault(key(doc), i)
        moves = [(removed[k], j) for j, _ in self.inserts if (k := key(self.replay[j])) in removed]
        if not moves:
            return None
        return min(i for i, _ in moves), min(j for _, j in moves)

    def _in_order_from(self, o_from: int, r_from: int) -> None:
        """Pair the lane in order after its last pair before (``o_from``, ``r_from``)."""
        kept = [(i, j) for i, j in self.pairs if i < o_from and j < r_from]
        o_start, r_start = (kept[-1][0] + 1, kept[-1][1] + 1) if kept else (0, 0)
        self.inserts = [(j, before) for j, before in self.inserts if j < r_start]
        self.pairs = kept
        self._diff(o_start, len(self.original), r_start, len(self.replay), ())


def _departures(original: Mapping[int, Mapping[str, Any]], pairs: Mapping[int, int],
                inserts: list[tuple[int, int, int | None]]) -> dict[int, int]:
    """Extra replay sequence → the source sequence where its lane departs (module docstring).

    In a replay that interleaves the lanes differently, that is the extra's lane successor. Otherwise
    it is the smallest source sequence after the extra's lane predecessor whose partner the replay
    writes after the extra, not a terminal status, and at most the lane successor's. The smallest
    such sequence over the whole replay suffix answers almost every extra at once; only when the
    replay delayed an event from before the predecessor does the search walk the source forward.
    """
    anchors = sorted((r_seq, o_seq) for o_seq, r_seq in pairs.items()
                     if original[o_seq].get("type") not in TERMINAL_TYPES)
    anchor_r = [r_seq for r_seq, _ in anchors]
    after_end = max(original) + 1
    suffix_min: list[int] = [0] * len(anchors)
    smallest = after_end
    for i in range(len(anchors) - 1, -1, -1):
        smallest = min(smallest, anchors[i][1])
        suffix_min[i] = smallest
    r_in_source_order = [r_seq for _, r_seq in sorted(pairs.items())]
    interleaved = any(a > b for a, b in itertools.pairwise(r_in_source_order))
    out: dict[int, int] = {}
    for x, previous, following in inserts:
        if interleaved and following is not None:
            out[x] = following  # the other lanes' indexes say nothing of this lane: its displaced event does
            continue
        i = bisect_right(anchor_r, x)
        first: int | None = suffix_min[i] if i < len(anchors) else None
        if first is not None and first <= previous:
            end = following if following is not None else after_end
            first = next((s for s in range(previous + 1, end) if s in pairs and pairs[s] > x
                          and original[s].get("type") not in TERMINAL_TYPES), None)
        if following is not None:
            out[x] = following if first is None else min(first, following)
        elif first is not None:
            out[x] = first
    return out
