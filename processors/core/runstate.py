"""The run-state step: one committed event → the run's new table record and the records to send.

It calls the one pure fold (:mod:`processors.core.fold`) — the same function replay
uses — and turns its outputs into records. It also re-checks the hash chain of
what it reads, so a record rewritten in the log is flagged where it is consumed,
not only when someone thinks to replay. The Faust agent around it is
:mod:`processors.worker.runstate`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from processors.core.fold import fold
from processors.core.handoff import State
from processors.core.statehash import ExactStateHash
from schemas.canonical import GENESIS, chain_hash, jcs, sha256_hex
from schemas.records import CommittedEvent, Violation, run_snapshot, state_digest, violation

log = logging.getLogger("agentlog.runstate")

TERMINAL_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})

# Incremental state hashers of recently stepped runs, least recently used first. A memo, not
# state: a run without one (new process, evicted) gets a fresh hasher and the same hash; it
# lives beside the Faust table because it holds object identities, which do not survive a changelog.
_HASHERS: dict[str, ExactStateHash] = {}
_MAX_HASHERS = 1024


def _state_hash(run_id: str, state: State, *, verify: bool) -> str:
    """``fold.state_hash(state)``, hashing again only the top-level members from the first one changed.

    :class:`ExactStateHash` (#13 session 8; before, :class:`~processors.core.statehash.StateHasher`,
    whose Python walk of every changed dict was the largest part of the worker's own per-event work).
    With ``verify`` (snapshot points, which canonicalise the whole state anyway) the result
    is checked against a full :func:`jcs` of the state; a difference means a state was
    mutated after it was hashed (the fold is copy-on-write, states are read-only), so the
    run's cache is dropped and the full hash is used.
    """
    hasher = _HASHERS.pop(run_id, None) or ExactStateHash()
    _HASHERS[run_id] = hasher
    if len(_HASHERS) > _MAX_HASHERS:
        del _HASHERS[next(iter(_HASHERS))]
    digest = hasher(state)
    if verify:
        full = sha256_hex(jcs(state))
        if full != digest:
            log.error("incremental state hash of run %s disagreed with the full hash; cache dropped", run_id)
            del _HASHERS[run_id]
            digest = full
    return digest


#: One record for the worker to send: ``(topic short name, key, value)``.
Send = tuple[str, str | None, Mapping[str, Any]]


class RunRecord(TypedDict):
    """A run's record in the ``runs`` table, as :func:`step` writes it."""

    state: State | None  # the folded state; None only before the first event
    next: int  # the sequence expected next
    head: str  # hash of the last committed event (GENESIS before the first)
    since: int  # events folded since the last snapshot


def step(record: RunRecord | None, committed: CommittedEvent, *, partition: int, offset: int,
         snapshot_every: int, handoff_mode: str) -> tuple[RunRecord | None, list[Send]]:
    """Advance one run by one committed event; pure.

    Returns the run's new table record (None when the event is a duplicate to skip)
    and the records to send as ``(topic short name, key, value)``. A rewritten copy of an
    already folded sequence returns the record unchanged and a ``hash_chain_broken`` violation.
    """
    doc = committed["doc"]
    run_id = doc["runId"]
    rec = record or {"state": None, "next": 0, "head": GENESIS, "since": 0}
    seq = doc["sequence"]
    if seq < rec["next"]:
        # A later copy of a (runId, sequence) already folded. A redelivery is byte-identical, so
        # its doc still hashes to the hash it carries; a copy whose doc does not was rewritten
        # after it was committed. (A rewrite with a recomputed hash is caught by replay, which
        # compares the copies.)
        carried = committed.get("hash")
        if carried != chain_hash(str(committed.get("prevHash")), doc):
            return rec, [("violations", run_id, _violation(
                run_id, "hash_chain_broken",
                f"a later copy of sequence {seq} carries hash {carried}, but its doc hashes to "
                f"{chain_hash(str(committed.get('prevHash')), doc)}: the record was rewritten", doc))]
        return None, []  # a redelivered or duplicated log record: readers dedup by (runId, sequence)
    sends: list[Send] = []
    if seq > rec["next"]:
        sends.append(("violations", run_id, _violation(
            run_id, "log_gap", f"committed log jumps from sequence {rec['next'] - 1} to {seq}", doc)))
    expected_hash = chain_hash(rec["head"], doc)
    if committed.get("prevHash") != rec["head"] or committed.get("hash") != expected_hash:
        sends.append(("violations", run_id, _violation(
            run_id, "hash_chain_broken",
            f"record at sequence {seq} has prevHash {committed.get('prevHash')} / hash {committed.get('hash')}, "
            f"expected {rec['head']} / {expected_hash}", doc)))
    adv = advance(rec, doc, expected_hash, snapshot_every=snapshot_every, handoff_mode=handoff_mode)
    sends.extend(adv.sends)
    new = adv.record
    sends.append(("digests", run_id, state_digest(
        run_id=run_id, sequence=seq, state_hash=adv.state_hash, head_hash=new["head"], log_partition=partition,
        log_offset=offset)))
    if adv.snapshot:
        sends.append(("snapshots", run_id, run_snapshot(
            run_id=run_id, at_sequence=seq, log_partition=partition, log_offset=offset, state=adv.state,
            state_hash=adv.state_hash, head_hash=new["head"])))
    return new, sends


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
            handoff_mode: str) -> Advanced:
    """Fold ``doc`` (the run's next sequence, already chained to ``head_hash``) into the run; pure.

    The one-pass worker calls this right after the sequencer's decision, so the chain is not
    re-checked here (it was computed a moment ago from the same doc); :func:`step`, which reads
    records back from the log, checks it first and then calls this.
    """
    run_id = doc["runId"]
    rec = record or {"state": None, "next": 0, "head": GENESIS, "since": 0}
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
    snapshot = since >= snapshot_every or doc["type"] in TERMINAL_TYPES
    s_hash = _state_hash(run_id, state, verify=snapshot)
    new: RunRecord = {"state": state, "next": doc["sequence"] + 1, "head": head_hash,
                      "since": 0 if snapshot else since}
    return Advanced(new, state, sends, s_hash, snapshot)


def refold_due(record: RunRecord | None, sequence: int) -> bool:
    """Whether a redelivered event at ``sequence`` must be folded again into its run's ``record``.

    Only when the record stops exactly before it: a crash made the event's index entry durable and
    not the run state that followed it. A record already past it (the run state was made durable
    and the head was not: the two share one round trip, #13 session 9) has folded it, and folding
    it again would apply it twice; a record further behind is caught up from the log by the run's
    next accepted event.
    """
    return (record["next"] if record else 0) == sequence


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
