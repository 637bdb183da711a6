"""The run-state step: one accepted event → the run's new table record, its state hash and the records to send.

It calls the one pure fold (:mod:`agentlog.core.fold`) — the same function replay
uses — and turns its outputs into records. The one-pass sequencer
(:mod:`agentlog.worker.sequencer`) folds every accepted event here before it commits it, so
the committed record carries the state hash at its index. :func:`chain_problem` is what the
live log check (:mod:`agentlog.worker.runstate`) says about a record read back from the log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from agentlog.core.fold import fold
from agentlog.core.handoff import State
from agentlog.core.statehash import ExactStateHash
from agentlog.schemas.canonical import GENESIS, chain_hash, jcs, jcs_parsed, sha256_hex
from agentlog.schemas.records import Violation, violation

log = logging.getLogger("agentlog.runstate")

TERMINAL_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})

class _RunHash:
    """What the worker remembers of a run's last state hash (:func:`_state_hash`)."""

    __slots__ = ("digest", "hasher", "size", "state")

    def __init__(self, state: State, digest: str, size: int, hasher: ExactStateHash | None) -> None:
        self.state, self.digest, self.size, self.hasher = state, digest, size, hasher


# The last state hash of each run in flight, least recently used first. A memo, not state: a run
# without one (new process, evicted) is hashed in full, to the same hash; it lives beside the
# Faust table because it holds object identities, which do not survive a changelog.
_RUN_HASHES: dict[str, _RunHash] = {}
#: As many runs as the worker's tables keep decoded (:class:`agentlog.worker.tables.LocalTable`).
#: A run's entry goes at its terminal event.
_MAX_RUN_HASHES = 8192
#: A state whose canonical bytes are at least this long is hashed incrementally from then on
#: (:class:`ExactStateHash`: only the top-level members from the first one changed are hashed
#: again), below it in full. A run's state is a few hundred bytes to a few KB on the realistic
#: workload, where the incremental hasher (its dozen SHA-256 contexts and member bytes per run,
#: kept for ~3,000 runs) cost ~10 µs an event more than hashing the whole state again
#: (tests/bench/JOURNAL.md, "Speed on real agent runs"); a long run's state (a channel keeps every
#: value written to it) would make hashing it in full at every index quadratic.
INCREMENTAL_FROM_BYTES = 8192


def _state_hash(run_id: str, state: State, *, verify: bool, last: bool = False) -> str:
    """``fold.state_hash(state)``, without hashing a state the run's last hash was of.

    A state the fold returned unchanged (the same object: LLM calls, tools, usage) has the hash of
    the index before. A changed state is canonicalised and hashed in full while it is small
    (:data:`INCREMENTAL_FROM_BYTES`), and by the run's :class:`ExactStateHash` once it is not.
    With ``verify`` (snapshot points, which canonicalise the whole state anyway) a hash that was
    not computed in full here is checked against a full :func:`jcs` of the state; a difference
    means a state was mutated after it was hashed (the fold is copy-on-write, states are
    read-only), so the run's memo is dropped and the full hash is used. ``last``: the run ended
    here, its memo goes.
    """
    memo = _RUN_HASHES.pop(run_id, None)
    full = False
    if memo is not None and memo.state is state:
        digest = memo.digest
    elif memo is not None and (memo.hasher is not None or memo.size >= INCREMENTAL_FROM_BYTES):
        if memo.hasher is None:
            memo.hasher = ExactStateHash()
        digest = memo.hasher(state)
        memo.state, memo.digest = state, digest
    else:
        data = jcs_parsed(state)
        digest, full = sha256_hex(data), True
        memo = _RunHash(state, digest, len(data), None)
    if verify and not full:
        checked = sha256_hex(jcs(state))
        if checked != digest:
            log.error("the remembered state hash of run %s disagreed with the full hash; memo dropped", run_id)
            return checked
    if not last:
        _RUN_HASHES[run_id] = memo
        if len(_RUN_HASHES) > _MAX_RUN_HASHES:
            del _RUN_HASHES[next(iter(_RUN_HASHES))]
    return digest


#: One record for the worker to send: ``(topic short name, key, value)``.
Send = tuple[str, str | None, Mapping[str, Any]]


class RunRecord(TypedDict):
    """A run's record in the ``runs`` table, as :func:`advance` makes it: its head and its folded state.

    One record holds both, so they are durable together: the sequencer decides an event on
    ``next`` and ``head`` and folds it into ``state`` in the same step.
    """

    state: State | None  # the folded state; None only before the first event
    next: int  # the sequence expected next
    head: str  # hash of the last committed event (GENESIS before the first)
    since: int  # events folded since the last snapshot
    ts: int | None  # Kafka timestamp (ms) of the last event's ingest record (when the run goes idle)
    end: bool  # a terminal event is committed (the run closes after its grace period)


@dataclass(frozen=True, slots=True)
class Advanced:
    """What folding one event into a run gives: the run's new record, the records to send, its state hash.

    ``snapshot`` says the run is due one at this index (every ``snapshot_every`` events and at a
    terminal event); the caller makes it, because a snapshot names the log offset of its event,
    which the one-pass worker only learns once the broker has acknowledged the log record.
    """

    record: RunRecord
    state: State  # record["state"], never None once an event is folded
    sends: list[Send]
    state_hash: str
    snapshot: bool


def advance(record: RunRecord | None, doc: dict[str, Any], head_hash: str, *, snapshot_every: int,
            handoff_mode: str, ts_ms: int | None = None) -> Advanced:
    """Fold ``doc`` (the run's next sequence, already chained to ``head_hash``) into the run; pure.

    The one-pass worker calls this (through :func:`fold_next`) right after the sequencer's
    decision, so the chain is not re-checked here: it was computed a moment ago from the same doc.
    ``ts_ms`` is the Kafka timestamp of the event's ingest record (the record's ``ts``).
    """
    run_id = doc["runId"]
    rec = record or _NEW_RUN
    state, outputs = fold(rec["state"], doc, handoff_mode=handoff_mode)
    sends: list[Send] = []
    for out in outputs:
        kind = out.get("kind")
        body = {k: v for k, v in out.items() if k != "kind"}
        if kind == "transition":
            sends.append(("transitions", body.get("parentRunId") or run_id, body))
        elif kind == "violation":
            sends.append(("violations", run_id, body))
        elif kind == "link":
            sends.append(("handoff-links", body["childRunId"], {"kind": "link", "link": body}))
    if doc["type"] in TERMINAL_TYPES:
        sends.append(("handoff-links", run_id, {"kind": "child-terminal", "event": doc}))
    since = rec["since"] + 1
    terminal = doc["type"] in TERMINAL_TYPES
    snapshot = since >= snapshot_every or terminal
    s_hash = _state_hash(run_id, state, verify=snapshot, last=terminal)
    new: RunRecord = {"state": state, "next": doc["sequence"] + 1, "head": head_hash,
                      "since": 0 if snapshot else since, "ts": ts_ms, "end": terminal or bool(rec.get("end"))}
    return Advanced(new, state, sends, s_hash, snapshot)


_NEW_RUN: RunRecord = {"state": None, "next": 0, "head": GENESIS, "since": 0, "ts": None, "end": False}


#: The rejection reason of an accepted event that its run's state cannot take (CONTRACT.md "Rejection").
RUN_STATE_UNAVAILABLE = "run_state_unavailable"


@dataclass(frozen=True, slots=True)
class Unfoldable:
    """Why an accepted event cannot be folded into its run; the sequencer refuses the event with it."""

    detail: str


def fold_next(record: RunRecord | None, doc: dict[str, Any], head_hash: str, *, snapshot_every: int,
              handoff_mode: str, ts_ms: int | None = None) -> Advanced | Unfoldable:
    """:func:`advance`, or why the event cannot be folded: the fold raised (a bug).

    The sequencer accepts ``doc`` on ``record``'s own ``next`` and ``head``, so the record is the
    run's state just before it. Every committed record carries the state hash at its index, so an
    event whose fold fails is not committed without one (that would be a hash every later record
    and checkpoint repeats): it is refused, its bytes kept in ``rejections``, and the run's log
    stays as it was.
    """
    try:
        return advance(record, doc, head_hash, snapshot_every=snapshot_every, handoff_mode=handoff_mode,
                       ts_ms=ts_ms)
    except Exception as e:  # a fold bug: the sequencer has validated the event
        run_id, seq = doc["runId"], doc["sequence"]
        log.exception("cannot fold run %s at sequence %d", run_id, seq)
        return Unfoldable(f"folding run {run_id} at sequence {seq} failed ({type(e).__name__}: {e}); "
                          + _NOT_APPENDED)


_NOT_APPENDED = ("the event is not appended, because every log record carries the state hash at its index "
                 "(an internal error of the worker: its log says more)")


def _violation(run_id: str, code: str, detail: str, doc: Mapping[str, Any]) -> Violation:
    """A chain-check violation: it names the committed event, and no handoff machine."""
    return violation(run_id=run_id, code=code, detail=detail, event_id=doc.get("eventId"),
                     sequence=doc.get("sequence"))


def chain_problem(committed: Mapping[str, Any]) -> Violation | None:
    """A ``hash_chain_broken`` violation when a log record's doc does not hash to the hash it carries; pure.

    What the live log check can say about a record without any state: every record the
    sequencer writes satisfies it (redeliveries included), so a record that does not was
    written or altered behind the sequencer's back. (A forgery with a recomputed hash is
    caught by replay, which compares it with the chain it breaks.)
    """
    doc = committed.get("doc")
    if not isinstance(doc, dict) or not isinstance(doc.get("runId"), str):
        return None
    prev, carried = committed.get("prevHash"), committed.get("hash")
    try:
        recomputed = chain_hash(str(prev), doc)
    except Exception as e:  # a doc that cannot be canonicalised was not written by the sequencer
        recomputed = f"<not canonicalisable: {type(e).__name__}>"
    if carried == recomputed:
        return None
    return _violation(doc["runId"], "hash_chain_broken",
                      f"record at sequence {doc.get('sequence')} carries hash {carried}, but its doc hashes to "
                      f"{recomputed} after prevHash {prev}: the record was written or altered after commit", doc)
