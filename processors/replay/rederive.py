"""Re-derivation from an offset (SPEC §7.1).

Re-derivation answers "does the committed log still produce what we recorded?": start from
the nearest snapshot at or before the requested point, re-read the committed log with a plain
consumer (assign + seek, read_committed, via :mod:`agentlog.streams.reader`), refold with
:func:`agentlog.core.fold.fold` — the very function the live processor ran — and at every index
check three things against what was recorded:

* the hash chain itself: ``prevHash`` is the previous record's hash and
  ``hash == chain_hash(prevHash, doc)``; a later copy of a ``(runId, sequence)`` that differs
  from the first one is a rewrite. Either is ``tampered``.
* the state hash of the refolded state against the ``stateHash`` the record carries (``state``),
  with a field-level diff when a recorded snapshot exists at that index.

Every log record carries the state hash at its index, written by the worker together with its
hash (log format 2); "the digest" of an index below is that pair, the record's ``stateHash`` and
its own ``hash`` (the head hash). A record without ``stateHash`` is log format 1, which this
version does not read: the replay stops with :class:`agentlog.schemas.errors.LogFormatError`
(``log_format_unsupported``). A forger who recomputes the chain can recompute the carried
stateHash too; the snapshots, the signed checkpoints (``agentlog verify``) and the audit store's
copy are then the independent record.

A sequence the log skips is ``missing``.

Recorded hashes are checked the cheap way first (:func:`agentlog.schemas.canonical.hashes_to` for the
chain: orjson's sorted bytes hashed as they are, an equal SHA-256 proving they are the JCS bytes;
:class:`agentlog.core.statehash.ResumableStateHash` for the state: the same kind of candidate,
with SHA-256 resumed from the first top-level member the event changed), and only a hash that
does not match that way is computed exactly, through the incremental hasher and then the
reference encoder, which is what every reported divergence rests on.

Every read of one replay goes through one consumer (:class:`agentlog.streams.reader.TopicReader`).

The snapshots topic is compacted, so often only the run's latest snapshot survives; when it
is later than the start point, or does not hash to what it claims, the replay refolds from
sequence 0 instead and says so (``snapshot_used`` is ``None``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from agentlog.core.fold import fold, fold_noting, state_hash
from agentlog.core.keyring import KeyringError
from agentlog.core.sealing import SealError, is_sealed, open_value
from agentlog.core.statehash import ResumableStateHash, StateHasher
from agentlog.metrics import METRICS
from agentlog.replay.compare import ABSENT, first_difference
from agentlog.replay.divergence import Divergence, DivergenceKind
from agentlog.replay.host import host_verdicts
from agentlog.schemas.canonical import GENESIS, canonical_leaf, chain_hash, hashes_to, reference_jcs, sha256_hex
from agentlog.schemas.errors import AgentlogError, ReplayError
from agentlog.schemas.records import Verdict, log_format_error
from agentlog.streams.codec import decode_record
from agentlog.streams.keyring import load_keyring
from agentlog.streams.reader import TopicReader, read_run
from agentlog.streams.settings import Settings
from agentlog.streams.topics import partition_for

log = logging.getLogger("agentlog.rederive")

__all__ = ["RederivationResult", "record_metrics", "replay_run", "replay_run_with_host_verdict"]

RederivationVerdict = Literal["match", "diverged", "error"]

#: Metric aspect each divergence kind counts under (``replay_behavior_*_total{aspect}``).
_ASPECT = {"state": "state", "tampered": "chain", "missing": "chain"}
#: ``head`` (the run's head hash) is checked with the chain: each record's hash is its head hash, so a
#: chain that holds has the recorded head at every index, and a break is counted under ``chain``.
REDERIVATION_ASPECTS = ("state", "head", "chain")

#: How often (in events) the progress callback is called.
PROGRESS_EVERY = 500

Progress = Callable[[int, int | None], None]


@dataclass(frozen=True, kw_only=True)
class RederivationResult:
    """The outcome of one re-derivation; a divergence is a result, not an exception.

    ``first_divergence`` (and each of ``divergences``) is a :class:`Divergence` of engine
    ``rederivation`` (JSON ``{atSequence, kind, path, expected, actual, logOffset, detail}``;
    ``expected`` is what was recorded, ``actual`` what the log refolds to). ``compared`` counts the
    indexes checked against their recorded state hash. ``error`` is set with verdict ``error``
    (e.g. the run has no log).
    """

    verdict: RederivationVerdict
    run_id: str
    from_seq: int | None
    snapshot_used: int | None
    compared: int
    first_divergence: Divergence | None
    head_hash: str | None
    divergences: tuple[Divergence, ...] = ()
    collect_all: bool = False
    last_sequence: int | None = None
    log_partition: int | None = None
    read_from_offset: int | None = None
    snapshot_note: str | None = None
    bindings: dict[str, Any] = field(default_factory=dict)
    replay_of: dict[str, Any] | None = None
    error: dict[str, str] | None = None

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "runId": self.run_id,
            "fromSeq": self.from_seq,
            "snapshotUsed": self.snapshot_used,
            "compared": self.compared,
            "lastSequence": self.last_sequence,
            "firstDivergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "headHash": self.head_hash,
            "logPartition": self.log_partition,
            "readFromOffset": self.read_from_offset,
            "bindings": self.bindings,
            "replayOf": self.replay_of,
        }
        if self.snapshot_note:
            out["snapshotNote"] = self.snapshot_note
        if self.collect_all:
            out["divergences"] = [d.to_dict() for d in self.divergences]
        if self.error:
            out["error"] = self.error
        return out


def _divergence(seq: int, kind: DivergenceKind, *, path: str | None, expected: Any, actual: Any,
                offset: int | None, detail: str) -> Divergence:
    return Divergence(engine="rederivation", at_sequence=seq, kind=kind, path=path, expected=expected,
                      actual=actual, log_offset=offset, detail=detail, aspect=_ASPECT[kind])


# ---------------------------------------------------------------------------------------------
# Recorded data: the digests the log records carry, and snapshots


def _carried_digest(committed: Mapping[str, Any], partition: int | None, offset: int) -> dict[str, Any]:
    """The digest a log record carries: its stateHash, with its own hash as the head hash."""
    return {"sequence": committed["doc"]["sequence"], "stateHash": committed["stateHash"],
            "headHash": committed.get("hash"), "logPartition": partition, "logOffset": offset}


async def _log_digests(reader: TopicReader, run_id: str) -> dict[int, dict[str, Any]]:
    """The digests the run's log records carry, from the first copy of each sequence.

    Only a replay that starts after sequence 0 needs them up front (to map an offset to a
    sequence, check the snapshot it starts from, and judge later copies of earlier indexes);
    a replay from 0 reads each record's stateHash as it walks.

    Raises:
        LogFormatError: a first copy without ``stateHash`` (log format 1).
    """
    out: dict[int, dict[str, Any]] = {}
    seen: set[int] = set()
    async for partition, offset, _, value in reader.read("log", key=run_id):
        doc = value.get("doc")
        if not isinstance(doc, dict) or doc.get("runId") != run_id or type(seq := doc.get("sequence")) is not int:
            continue
        if seq not in seen:
            if "stateHash" not in value:
                raise log_format_error(value, partition=partition, offset=offset)
            out[seq] = _carried_digest(value, partition, offset)
        seen.add(seq)
    return out


class _Snapshots(Mapping[int, dict[str, Any]]):
    """The run's snapshots by atSequence, each kept as its record's bytes and decoded again when asked for.

    A replay starts from one snapshot and looks at another only to diff fields at a divergence,
    but a topic not compacted yet holds every snapshot of the run (each the whole state, KBs).
    Every record is still decoded once when read, so a corrupt one fails the replay with its
    decode error; what is not kept is the decoded state: keeping 200 of them alive cost
    about as much again as decoding them (allocation and the collector walking them, measured).
    """

    def __init__(self) -> None:
        self._raw: dict[int, bytes] = {}
        self._decoded: dict[int, dict[str, Any]] = {}
        self._log_offsets: dict[int, Any] = {}

    def add(self, at: int, raw: bytes, log_offset: Any = None) -> None:
        """Keep ``raw`` for ``at`` (the first record per atSequence), with its ``logOffset`` if known.

        The offset, read when the record was decoded to index it, lets a replay from a log offset
        pass over the snapshots at or after its start without decoding each of them again (that
        would be about 100 decodes of a whole state per replay from the middle of the bench's run).
        """
        if at not in self._raw:
            self._raw[at] = raw
            self._log_offsets[at] = log_offset

    def log_offset(self, at: int) -> Any:
        """The snapshot's ``logOffset`` as its record holds it (``None``: absent, or not given to :meth:`add`)."""
        return self._log_offsets.get(at)

    def __getitem__(self, at: int) -> dict[str, Any]:
        found = self._decoded.get(at)
        if found is None:
            found = self._decoded[at] = decode_record(self._raw[at])
        return found

    def __iter__(self) -> Iterator[int]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


#: The start of a snapshot record as the worker writes it (JCS: members in key order), up to the runId's value.
_SNAPSHOT_PREFIX = re.compile(rb'\{"atSequence":(0|[1-9][0-9]{0,14}),"headHash":"[0-9a-f]{64}",'
                              rb'"logOffset":(0|[1-9][0-9]{0,14}),"logPartition":(?:0|[1-9][0-9]{0,14}),"runId":')


async def _snapshots(reader: TopicReader, run_id: str) -> _Snapshots:
    """Every snapshot of the run still on the compacted topic, by atSequence.

    A record written as the worker writes it (JCS: ``atSequence``, ``headHash``, ``logOffset``,
    ``logPartition`` and ``runId`` come before the state) is indexed from that prefix and decoded only
    when it is used: the one a replay starts from, one diffed at a divergence (decoding
    the 200 whole states of the bench's run costs ~5 ms of CPU per replay, ~0.5 µs per verified event).
    Any other record is decoded strictly here, so one that is not JSON
    at all still fails the replay when read; a record with that prefix but broken further on fails
    it when it is used.
    """
    out = _Snapshots()
    run = canonical_leaf(run_id) + b',"state":'
    async for _, batch in reader.read_raw("snapshots", key=run_id):
        for _, _, raw in batch:
            _index_snapshot(out, raw, run_id, run)
    return out


def _index_snapshot(out: _Snapshots, raw: bytes, run_id: str, run: bytes) -> None:
    """Keep one snapshot record of ``run_id`` in ``out`` (``run``: its spelled runId and ``,"state":``)."""
    found = _SNAPSHOT_PREFIX.match(raw)
    if found is not None and raw.startswith(run, found.end()):
        out.add(int(found[1]), raw, int(found[2]))
        return
    value = decode_record(raw)
    if value.get("runId") == run_id and isinstance(at := value.get("atSequence"), int):
        out.add(at, raw, value.get("logOffset"))


def _snapshot_problem(snap: Mapping[str, Any], digests: Mapping[int, dict[str, Any]]) -> str | None:
    """Why a snapshot cannot be a starting point (None when it can)."""
    if not isinstance(snap.get("state"), dict) or not isinstance(snap.get("logOffset"), int):
        return "malformed"
    if state_hash(snap["state"]) != snap.get("stateHash"):
        return "its state does not hash to its stateHash"
    digest = digests.get(snap["atSequence"])
    if digest is not None and (digest["stateHash"] != snap["stateHash"] or digest["headHash"] != snap["headHash"]):
        return "it disagrees with the log record at that index"
    return None


def _pick_snapshot(snapshots: Mapping[int, dict[str, Any]], digests: Mapping[int, dict[str, Any]],
                   start_seq: int) -> tuple[dict[str, Any] | None, str | None]:
    """The latest trustworthy snapshot strictly before ``start_seq`` (the state *before* the start)."""
    notes = []
    for at in sorted((s for s in snapshots if s < start_seq), reverse=True):
        problem = _snapshot_problem(snapshots[at], digests)
        if problem is None:
            return snapshots[at], None
        notes.append(f"snapshot at {at} skipped: {problem}")
    if not notes and snapshots and start_seq > 0:
        notes.append(f"no snapshot before sequence {start_seq} (latest kept: {max(snapshots)}); refolded from 0")
    return None, "; ".join(notes) or None


async def _first_seq_at_offset(reader: TopicReader, run_id: str, partition: int, offset: int,
                               digests: Mapping[int, dict[str, Any]]) -> int:
    """Sequence of the run's first record at or after ``offset`` in its log partition."""
    after = [seq for seq, d in digests.items() if d.get("logOffset", -1) >= offset]
    if after:
        return min(after)
    records = reader.read("log", key=run_id, from_offsets={partition: offset})
    try:
        async for _, _, _, value in records:
            doc = value.get("doc")
            if isinstance(doc, dict) and doc.get("runId") == run_id and isinstance(seq := doc.get("sequence"), int):
                return seq
    finally:
        await records.aclose()
    raise ReplayError(f"run {run_id} has no committed event at or after log offset {offset} "
                      f"(partition {partition})")


async def _record_at(reader: TopicReader, run_id: str, partition: int, offset: int) -> dict[str, Any] | None:
    records = reader.read("log", key=run_id, from_offsets={partition: offset})
    try:
        async for _, got, _, value in records:
            return value if got == offset else None
    finally:
        await records.aclose()
    return None


# ---------------------------------------------------------------------------------------------
# State hashing at every index


def _reference_chain_hash(prev_hash: str, doc: dict[str, Any]) -> str:
    """``chain_hash`` through the reference ``rfc8785`` encoder: what a reported divergence rests on."""
    return sha256_hex(prev_hash.encode("ascii") + reference_jcs(doc))


def _reference_state_hash(state: Mapping[str, Any]) -> str:
    return sha256_hex(reference_jcs(state))


# ---------------------------------------------------------------------------------------------
# The re-derivation


class _Walk:
    """Mutable state of one pass over the log; kept apart so :func:`replay_run` reads as steps."""

    def __init__(self, *, state: dict[str, Any] | None, head: str, next_seq: int, collect_all: bool,
                 digests: Mapping[int, dict[str, Any]], snapshots: Mapping[int, dict[str, Any]],
                 handoff_mode: str, partition: int | None = None) -> None:
        """``digests``: those read up front (:func:`_log_digests`), to judge copies of indexes before the
        start; ``partition``: the run's log partition, named in errors."""
        self.state = state
        self.head = head
        self.next_seq = next_seq
        self.first_seq = next_seq
        self.collect_all = collect_all
        self.digests = digests
        self.snapshots = snapshots
        self.handoff_mode = handoff_mode
        self.hasher = StateHasher()
        self.candidate_hash = ResumableStateHash()
        self.partition = partition
        # seq -> (offset, prevHash as the record claims it (absent: None), recomputed head)
        self.seen: dict[int, tuple[int, str | None, str]] = {}
        self.divergences: list[Divergence] = []
        self.compared = 0
        self.events = 0
        self.state_blind = False  # after a missing record the state can no longer be refolded
        self.state_diverged = False  # the previous index already had a state divergence
        self.conflicts: list[tuple[int, int, dict[str, Any]]] = []  # (seq, offset of the altered copy, copy)
        # Copies of indexes before the start with no digest to judge them by (a replay that read
        # nothing before its snapshot): judged after the walk, against the log's first copies.
        self.defer_early = False
        self.unjudged: list[tuple[int, int, dict[str, Any], str]] = []  # (seq, offset, copy, recomputed hash)

    @property
    def stopped(self) -> bool:
        return bool(self.divergences) and not self.collect_all

    def add(self, d: Divergence) -> None:
        self.divergences.append(d)

    def record(self, offset: int, committed: dict[str, Any], doc: Any = None) -> None:
        """Check one log record of the run; ``doc`` is its ``doc`` member when the caller has it already."""
        if doc is None:
            doc = committed.get("doc")
        if not isinstance(doc, dict):
            return
        seq = doc.get("sequence")
        if type(seq) is not int:
            return
        if seq == self.next_seq and not self.divergences and not self.state_blind and self._usual(offset, committed,
                                                                                                  doc, seq):
            return
        if seq < self.next_seq:
            self._duplicate(seq, offset, committed)
            return
        if self.stopped:
            return  # fail-fast: the first divergence is found; only rewrites of earlier indexes still matter
        self.events += 1
        if seq > self.next_seq:
            missing = self.next_seq
            self.add(_divergence(
                missing, "missing", path=None, expected=f"sequence {missing}", actual=f"sequence {seq}",
                offset=offset,
                detail=f"the committed log jumps from sequence {missing - 1} to {seq}; "
                       f"{seq - missing} record(s) are missing"))
            self.state_blind = True
            self.head = committed.get("prevHash", self.head)  # resync so later records can still be chain-checked
            if self.stopped:
                return
        self._index(seq, offset, committed, doc)

    def _usual(self, offset: int, committed: dict[str, Any], doc: dict[str, Any], seq: int) -> bool:
        """The usual index, checked in one step: next in order, chained, its carried stateHash met.

        Whether the record continues the chain (``prevHash`` the head, its hash proven by
        :func:`hashes_to`) and the refolded state's candidate hash is the recorded one; ``True``
        when all of that holds and the index is recorded as :meth:`_index` would record it.
        ``False`` changes nothing (the fold is pure, the candidate hasher is a cache), and
        :meth:`_index` then judges the record the general way. Only called before any divergence,
        so there is no earlier state divergence to carry. Kept apart from the general path's
        branching (a record without stateHash, missing records, divergences to word), which the
        usual index needs none of: about 0.5 µs of CPU less per event (in-process A/B over the bench run).
        """
        recorded_state = committed.get("stateHash")
        claimed: Any = committed.get("hash")  # a str once hashes_to has matched it
        head = self.head
        if (type(recorded_state) is not str or committed.get("prevHash") != head
                or not hashes_to(claimed, doc, head.encode("ascii"))):
            return False
        prev = self.state
        state, _, note = fold_noting(prev, doc, handoff_mode=self.handoff_mode)
        # With the fold's note of the one entry it set, only that entry is written again.
        candidate = (self.candidate_hash(state) if note is None
                     else self.candidate_hash.after_set(state, prev, note[0], note[1]))
        if candidate != recorded_state:
            if note is not None:
                self.candidate_hash.forget()  # the general path spells the state afresh, trusting no note
            return False
        self.state = state
        self.events += 1
        self.compared += 1
        self.seen[seq] = (offset, head, claimed)
        self.head = claimed
        self.next_seq = seq + 1
        return True

    def usual_run(self, batch: Sequence[tuple[int, Any, bytes]], i: int, run_id: str, *,
                  progress: Progress | None = None, total: int | None = None) -> int:
        """Walk ``batch[i:]`` (undecoded log records) while each record is another run's or the usual index.

        Returns the position of the first record that is neither, for the caller to decode and give to
        :meth:`record` (the general way), or ``len(batch)``. The usual index is :meth:`_usual`'s, checked
        the same way and recorded the same way; this is that step and the caller's loop in one frame,
        with the walk's fields in locals, which is most of what the walk costs besides its C calls
        (decode, orjson, SHA-256): about 1 µs per event. Records that are not the
        run's are passed over as the callers do; a record whose ``doc`` is not an object is left
        to the caller (which passes over it too).
        """
        if self.divergences or self.state_blind:
            return i
        decode, noting, candidate, seen, mode = (decode_record, fold_noting, self.candidate_hash, self.seen,
                                                 self.handoff_mode)
        after_set = candidate.after_set
        state, head, next_seq, events, compared = self.state, self.head, self.next_seq, self.events, self.compared
        n = len(batch)
        try:
            while i < n:
                offset, _, data = batch[i]
                committed = decode(data)
                doc = committed.get("doc")
                if type(doc) is not dict:
                    break
                if doc.get("runId") != run_id:
                    i += 1
                    continue
                seq, recorded_state = doc.get("sequence"), committed.get("stateHash")
                claimed: Any = committed.get("hash")  # a str once hashes_to has matched it
                if (seq != next_seq or type(seq) is not int or type(recorded_state) is not str
                        or committed.get("prevHash") != head or not hashes_to(claimed, doc, head.encode("ascii"))):
                    break
                new, _, note = noting(state, doc, handoff_mode=mode)
                if (candidate(new) if note is None else after_set(new, state, note[0], note[1])) != recorded_state:
                    if note is not None:
                        candidate.forget()  # as in _usual: the general path spells the state afresh
                    break
                state = new
                events += 1
                compared += 1
                seen[seq] = (offset, head, claimed)
                head = claimed
                next_seq = seq + 1
                i += 1
                if progress is not None and events % PROGRESS_EVERY == 0:
                    self.events = events
                    progress(events, total)
        finally:
            self.state, self.head, self.next_seq, self.events, self.compared = state, head, next_seq, events, compared
        return i

    def _index(self, seq: int, offset: int, committed: dict[str, Any], doc: dict[str, Any]) -> None:
        """Judge the record at index ``seq`` the general way: its chain link, then its state hash.

        Raises:
            LogFormatError: the record carries no ``stateHash`` (log format 1).
        """
        if "stateHash" not in committed:
            raise log_format_error(committed, partition=self.partition, offset=offset)
        prev_claimed = committed.get("prevHash")
        claimed = committed.get("hash")
        recorded_state = committed["stateHash"]
        head = self.head
        if hashes_to(claimed, doc, head.encode("ascii")):
            expected_head = cast(str, claimed)  # proven by its SHA-256: the usual case, no canonicalisation
        else:
            expected_head = chain_hash(head, doc)
            if claimed != expected_head:
                # A divergence is only ever reported from the reference hash.
                expected_head = _reference_chain_hash(head, doc)
        found: Divergence | None = None
        if prev_claimed != head:
            found = _divergence(seq, "tampered", path="prevHash", expected=head, actual=prev_claimed,
                                offset=offset, detail="prevHash is not the hash of the previous record")
        elif claimed != expected_head:
            found = _divergence(seq, "tampered", path="hash", expected=expected_head, actual=claimed,
                                offset=offset,
                                detail="hash does not match chain_hash(prevHash, doc): the doc was altered "
                                       "after it was committed")
        self.seen[seq] = (offset, prev_claimed, expected_head)
        s_hash = None
        if not self.state_blind:
            self.state, _ = fold(self.state, doc, handoff_mode=self.handoff_mode)
            s_hash = self._state_hash(recorded_state)
        self.compared += 1
        # One wrong value stays wrong at every later index: report where a difference starts.
        state_differs = s_hash is not None and s_hash != recorded_state
        if found is None and state_differs and not self.state_diverged:
            found = self._state_divergence(seq, offset, recorded_state, s_hash)
        self.state_diverged = state_differs
        if found is not None:
            self.add(found)
        # Continue the chain from what the log claims, so one rewritten record is reported once.
        # The claim is taken as it is (cast): a record without a "hash" would leave None here.
        if found is not None and found.kind == "tampered":
            self.head = cast(str, claimed)
        else:
            self.head = expected_head
        self.next_seq = seq + 1

    def _state_hash(self, recorded: str | None) -> str:
        """``state_hash(self.state)``, checked against ``recorded`` the cheap way first.

        The resumable candidate equal to the recorded hash proves it (see
        :class:`ResumableStateHash`); otherwise the exact incremental hasher, and where that
        disagrees too, the reference encoder, which is what a reported divergence rests on.
        """
        assert self.state is not None
        if recorded is not None and self.candidate_hash(self.state) == recorded:
            return recorded
        s_hash = self.hasher(self.state)
        if s_hash != recorded:
            s_hash = _reference_state_hash(self.state)  # a divergence is only reported from the reference
        return s_hash

    def _state_divergence(self, seq: int, offset: int, recorded: str | None, s_hash: str | None) -> Divergence:
        snap = self.snapshots.get(seq)
        if (snap is not None and isinstance(snap.get("state"), dict)
                and snap.get("stateHash") == recorded):
            diff = first_difference(snap["state"], self.state)
            if diff is not None:
                path, expected, actual = diff
                return _divergence(
                    seq, "state", path=f"state.{path}" if path else "state",
                    expected=_plain(expected), actual=_plain(actual), offset=offset,
                    detail=f"refolded state differs from the recorded snapshot (stateHash "
                           f"{recorded} recorded, {s_hash} refolded)")
        return _divergence(seq, "state", path="stateHash", expected=recorded, actual=s_hash,
                           offset=offset,
                           detail="refolded state hash differs from the one the log record carries "
                                  "(no snapshot at this index to diff fields against)")

    def _duplicate(self, seq: int, offset: int, committed: dict[str, Any]) -> None:
        """A second copy of an index: identical → redelivery; different → a rewrite (``tampered``)."""
        doc = committed["doc"]
        claimed = committed.get("hash")
        recomputed = chain_hash(committed.get("prevHash") or "", doc)
        first = self.seen.get(seq)
        if first is not None:
            identical = first[1] == committed.get("prevHash") and first[2] == recomputed == claimed
        else:  # before where this replay started: judge the copy by the digest its first copy carries
            digest = self.digests.get(seq)
            if digest is None:
                if self.defer_early:
                    self.unjudged.append((seq, offset, committed, recomputed))
                return
            identical = recomputed == claimed == digest.get("headHash")
        if not identical:
            self.conflicts.append((seq, offset, committed))


async def _conflict_divergences(reader: TopicReader, run_id: str, partition: int, walk: _Walk) -> list[Divergence]:
    out = []
    for seq, offset, copy in walk.conflicts:
        first = walk.seen.get(seq)
        original = await _record_at(reader, run_id, partition, first[0]) if first else None
        path, expected, actual = "hash", (original or {}).get("hash"), copy.get("hash")
        if original is not None:
            diff = first_difference(original.get("doc"), copy.get("doc"))
            if diff is not None:
                path, expected, actual = f"doc.{diff[0]}" if diff[0] else "doc", diff[1], diff[2]
        out.append(_divergence(
            seq, "tampered", path=path, expected=_plain(expected), actual=_plain(actual), offset=offset,
            detail=f"a different copy of sequence {seq} was appended at log offset {offset}"
                   + (f" (first copy at {first[0]})" if first else "")))
    return out


def _plain(value: Any) -> Any:
    return None if value is ABSENT else value


async def replay_run(
    settings: Settings,
    run_id: str,
    *,
    from_offset: int | None = None,
    from_seq: int | None = None,
    collect_all: bool = False,
    progress: Progress | None = None,
) -> RederivationResult:
    """Re-derive run ``run_id`` from a log offset or a sequence and compare with what was recorded.

    ``from_offset`` is an offset in the run's log partition; ``from_seq`` a sequence; neither
    means from the first event. ``progress(done, total)`` is called every few hundred events
    (``total`` is an estimate, or None). Every index from the snapshot used (or 0) on is
    checked; the first divergence is the one with the lowest index.

    Raises:
        ReplayError: both start points given, a negative one, or nothing of the run at/after it.
        LogFormatError: a log record of the run carries no ``stateHash`` (log format 1,
            ``log_format_unsupported``): this version cannot check that log.
        InfraError: Kafka unreachable / topics missing.
    """
    if from_offset is not None and from_seq is not None:
        raise ReplayError("give --from-offset or --from-seq, not both")
    if (from_offset is not None and from_offset < 0) or (from_seq is not None and from_seq < 0):
        raise ReplayError("the start offset/sequence must be >= 0")
    # Every read of one replay goes through one consumer: its start-up is paid once.
    async with TopicReader(settings, topics=("snapshots", "log")) as reader:
        result = await _replay(reader, run_id, from_offset=from_offset, from_seq=from_seq, collect_all=collect_all,
                               progress=progress)
    return await _opened(settings, result)


async def _opened(settings: Settings, result: RederivationResult) -> RederivationResult:
    """``result`` with the sealed values its divergences name opened, where the run's key still exists.

    Re-derivation compares the stored form (no key needed); a person reading its diff wants the values.
    A value that does not open (erased, or altered so that it no longer opens) is shown as stored.
    """
    if not any(is_sealed(d.expected) or is_sealed(d.actual) for d in result.divergences):
        return result
    keyring = await load_keyring(settings, [result.run_id])
    event_ids = {c["doc"].get("sequence"): c["doc"].get("eventId")
                 for c in await read_run(settings, result.run_id, opened=False)}

    def opened(value: Any, d: Divergence) -> Any:
        if not is_sealed(value) or not d.path or not d.path.startswith("doc.payload"):
            return value
        try:
            return open_value(value, keyring.key_for, result.run_id, str(event_ids.get(d.at_sequence)),
                              tuple(d.path.split(".")[2:]))
        except (SealError, KeyringError):
            return value

    divergences = tuple(replace(d, expected=opened(d.expected, d), actual=opened(d.actual, d))
                        for d in result.divergences)
    return replace(result, divergences=divergences, first_divergence=divergences[0])


async def _replay(reader: TopicReader, run_id: str, *, from_offset: int | None, from_seq: int | None,
                  collect_all: bool, progress: Progress | None) -> RederivationResult:
    settings = reader.settings
    snapshots = await _snapshots(reader, run_id)
    digests: dict[int, dict[str, Any]] = {}
    if from_offset is not None or from_seq:
        quick = await _replay_from_snapshot(reader, run_id, snapshots, from_offset=from_offset, from_seq=from_seq,
                                            collect_all=collect_all, progress=progress)
        if quick is not None:
            return quick
        # A replay that does not walk from 0 needs the digests before its start point too.
        digests = await _log_digests(reader, run_id)
    partition = next(iter(digests.values()))["logPartition"] if digests else partition_for(settings, run_id)
    if from_offset is not None:
        start_seq = await _first_seq_at_offset(reader, run_id, partition, from_offset, digests)
    else:
        start_seq = from_seq or 0
    snap, note = _pick_snapshot(snapshots, digests, start_seq)
    if snap is not None:
        walk = _Walk(state=snap["state"], head=snap["headHash"], next_seq=snap["atSequence"] + 1,
                     collect_all=collect_all, digests=digests, snapshots=snapshots,
                     handoff_mode=settings.handoff_mode, partition=partition)
        read_from = snap["logOffset"] + 1
    else:
        walk = _Walk(state=None, head=GENESIS, next_seq=0, collect_all=collect_all, digests=digests,
                     snapshots=snapshots, handoff_mode=settings.handoff_mode, partition=partition)
        # Where sequence 0 sits, when the digests were read; else the partition from its start.
        read_from = digests[0].get("logOffset") if 0 in digests else None
    total = (max(digests) + 1 - walk.first_seq) if digests else None
    from_offsets = {partition: read_from} if read_from is not None else None
    # A fetched batch at a time, undecoded: the loop over it is plain Python (no async step per record).
    async for _, batch in reader.read_raw("log", key=run_id, from_offsets=from_offsets):
        i, n = 0, len(batch)
        while i < n:
            i = walk.usual_run(batch, i, run_id, progress=progress, total=total)  # usual indexes, in one frame
            if i == n:
                break
            offset, _, data = batch[i]
            i += 1
            value = decode_record(data)
            doc = value.get("doc")
            if not isinstance(doc, dict) or doc.get("runId") != run_id:
                continue
            walk.record(offset, value, doc)
            if progress is not None and walk.events % PROGRESS_EVERY == 0 and walk.events:
                progress(walk.events, total)
    if walk.next_seq == walk.first_seq and not walk.divergences and snap is None:
        return _error(run_id, start_seq, ReplayError(
            f"run {run_id} has no committed events in {settings.topic_prefix}.log; check the run id and prefix"))
    return await _result(reader, run_id, walk, partition=partition, start_seq=start_seq, snap=snap,
                         read_from=read_from, note=note, total=total, progress=progress)


async def _result(reader: TopicReader, run_id: str, walk: _Walk, *, partition: int, start_seq: int,
                  snap: Mapping[str, Any] | None, read_from: int | None, note: str | None, total: int | None,
                  progress: Progress | None) -> RederivationResult:
    """Finish a walk: its last checks, the rewrites of earlier indexes, the frozen result and its metrics."""
    collect_all = walk.collect_all
    if walk.state is not None and not walk.state_blind and walk.hasher(walk.state) != state_hash(walk.state):
        raise ReplayError("internal: the incremental state hash disagrees with state_hash; report this bug",
                          code="replay_internal")
    if progress is not None:
        progress(walk.events, total)
    if walk.unjudged:
        early = await _log_digests(reader, run_id)
        for seq, offset, copy, recomputed in walk.unjudged:
            digest = early.get(seq)
            if digest is not None and not recomputed == copy.get("hash") == digest.get("headHash"):
                walk.conflicts.append((seq, offset, copy))
    divergences = walk.divergences + await _conflict_divergences(reader, run_id, partition, walk)
    divergences.sort(key=lambda d: (d.at_sequence, d.kind != "tampered"))
    if not collect_all:
        divergences = divergences[:1]
    state = walk.state or {}
    result = RederivationResult(
        verdict="diverged" if divergences else "match",
        run_id=run_id,
        from_seq=start_seq,
        snapshot_used=snap["atSequence"] if snap else None,
        compared=walk.compared,
        first_divergence=divergences[0] if divergences else None,
        head_hash=walk.head if walk.next_seq > 0 else None,
        divergences=tuple(divergences),
        collect_all=collect_all,
        last_sequence=walk.next_seq - 1,
        log_partition=partition,
        read_from_offset=read_from,
        snapshot_note=note,
        bindings=dict(state.get("bindings") or {}),
        replay_of=state.get("replayOf"),
    )
    record_metrics(result)
    return result


def _snapshot_before(snapshots: Mapping[int, dict[str, Any]], *, from_offset: int | None,
                     from_seq: int | None) -> dict[str, Any] | None:
    """The latest well-formed, self-consistent snapshot whose log record is before the start point."""
    for at in sorted(snapshots, reverse=True):
        if from_offset is None and at >= (from_seq or 0):
            continue  # not before the start: no need to decode it
        if from_offset is not None and isinstance(snapshots, _Snapshots):
            known = snapshots.log_offset(at)
            if not isinstance(known, int) or known >= from_offset:
                continue  # malformed, or not before the start: the same verdict as decoding it again
        snap = snapshots[at]
        if not isinstance(snap.get("state"), dict) or not isinstance(snap.get("logOffset"), int):
            continue
        before = snap["logOffset"] < from_offset if from_offset is not None else at < (from_seq or 0)
        if before and isinstance(snap.get("headHash"), str) and state_hash(snap["state"]) == snap.get("stateHash"):
            return snap
    return None


async def _replay_from_snapshot(reader: TopicReader, run_id: str, snapshots: Mapping[int, dict[str, Any]], *,
                                from_offset: int | None, from_seq: int | None, collect_all: bool,
                                progress: Progress | None) -> RederivationResult | None:
    """Re-derivation from a later start, reading the log once: from the snapshot's own record on.

    Log records carry their digests, so nothing before the snapshot is needed up front: the
    snapshot is checked against the record it names (same sequence, stateHash and hash, which is
    what :func:`_snapshot_problem` checks against a digest), the start sequence is the first index
    reached at or after ``from_offset``, and the rare later copy of an index before the snapshot is
    judged after the walk, against the log's first copies. ``None`` when this cannot be done here (no
    snapshot before the start, or the snapshot does not match its record): the caller then takes the
    general path, which reads the digests of the whole log first.
    """
    snap = _snapshot_before(snapshots, from_offset=from_offset, from_seq=from_seq)
    if snap is None:
        return None
    settings = reader.settings
    at, partition = snap["atSequence"], partition_for(settings, run_id)
    walk = _Walk(state=snap["state"], head=snap["headHash"], next_seq=at + 1, collect_all=collect_all, digests={},
                 snapshots=snapshots, handoff_mode=settings.handoff_mode, partition=partition)
    walk.defer_early = True
    start_seq: int | None = from_seq if from_offset is None else None
    snap_offset = snap["logOffset"]
    records = reader.read_raw("log", key=run_id, from_offsets={partition: snap_offset})
    try:
        async for _, batch in records:
            i, n = 0, len(batch)
            while i < n:
                if start_seq is not None:  # the usual indexes in one frame, once the start is known
                    i = walk.usual_run(batch, i, run_id, progress=progress)
                    if i == n:
                        break
                offset, _, data = batch[i]
                i += 1
                value = decode_record(data)
                doc = value.get("doc")
                if not isinstance(doc, dict) or doc.get("runId") != run_id:
                    continue
                if offset == snap_offset:
                    if (doc.get("sequence") != at or value.get("stateHash") != snap.get("stateHash")
                            or value.get("hash") != snap["headHash"]):
                        return None  # the snapshot disagrees with the record it names: the general path says so
                    continue
                seq = doc.get("sequence")
                if start_seq is None and offset >= (from_offset or 0) and type(seq) is int and seq >= walk.next_seq:
                    start_seq = seq
                walk.record(offset, value, doc)
                if progress is not None and walk.events % PROGRESS_EVERY == 0 and walk.events:
                    progress(walk.events, None)
    finally:
        await records.aclose()
    if walk.events == 0 and walk.next_seq == at + 1 and not walk.unjudged:
        return None  # nothing read past the snapshot (or its record is gone): let the general path explain
    if start_seq is None:
        raise ReplayError(f"run {run_id} has no committed event at or after log offset {from_offset} "
                          f"(partition {partition})")
    return await _result(reader, run_id, walk, partition=partition, start_seq=start_seq, snap=snap,
                         read_from=snap["logOffset"] + 1, note=None, total=None, progress=progress)


async def replay_run_with_host_verdict(
    settings: Settings,
    run_id: str,
    *,
    from_offset: int | None = None,
    from_seq: int | None = None,
    collect_all: bool = False,
    progress: Progress | None = None,
) -> tuple[RederivationResult, Verdict | None]:
    """:func:`replay_run`, and when the run is itself a host replay, its latest host-replay verdict.

    A run that declares ``replayOf`` may match its own recorded state hashes and still be a
    ``what-if`` of its source (other bound versions, MACP §3); showing the verdict beside the
    re-derivation keeps the one from being read as the other. The verdict is ``None`` when the
    run is no host replay or no verdict is recorded yet.

    Raises:
        ReplayError, LogFormatError, InfraError: as :func:`replay_run`.
    """
    result = await replay_run(settings, run_id, from_offset=from_offset, from_seq=from_seq,
                              collect_all=collect_all, progress=progress)
    if not result.replay_of:
        return result, None
    found = await host_verdicts(settings, run_id)
    return result, found[-1] if found else None


def _error(run_id: str, start_seq: int | None, e: AgentlogError) -> RederivationResult:
    return RederivationResult(verdict="error", run_id=run_id, from_seq=start_seq, snapshot_used=None, compared=0,
                              first_divergence=None, head_hash=None, error=e.to_dict())


def record_metrics(result: RederivationResult) -> None:
    """Count one re-derivation into ``replay_behavior_{match,mismatch}_total{aspect}`` (state/head/chain).

    Fail-fast results count only what they established: the aspect that diverged as a mismatch,
    and nothing as a match (the rest of the run was not examined).
    """
    if result.verdict == "error":
        return
    mismatched = {d.aspect for d in result.divergences}
    exhaustive = result.collect_all or not mismatched
    for aspect in REDERIVATION_ASPECTS:
        if aspect in mismatched:
            METRICS.inc("replay_behavior_mismatch_total", aspect=aspect)
        elif exhaustive:
            METRICS.inc("replay_behavior_match_total", aspect=aspect)
