"""The sequencer agent, one pass: ingest → committed log (with its state hash) + fold outputs | rejections.

The single writer of the committed log per partition (SPEC §4). What to do with a
record is :func:`agentlog.core.sequencing.sequence` (decode, validate, decide); an
accepted event is folded into its run right here (:func:`agentlog.core.runstate.advance`),
so the committed record carries the state hash at its index (log format 2) and no event
goes through a second consumer (ingest → log → run state) to be folded: every extra hop
costs as much delivery again.

Tables: ``index`` (eventId → position) and ``runs`` (per run: its chain head and its folded state, one record,
so the two are always durable together), written in the batch's transaction with every output of the batch (log
records, transitions, violations, handoff links, snapshots) and its next ingest offset
(:mod:`agentlog.worker.txruntime`): all of it is committed, or none of it is and the batch is handled again. Every
committed record carries its state hash, so an accepted event whose fold fails (a bug) is not committed without one:
it goes to ``rejections`` with reason ``run_state_unavailable`` (:func:`agentlog.core.runstate.fold_next`).

Content is redacted and sealed here (SPEC §12): an accepted doc is first redacted by the deployment's policy
(:meth:`agentlog.core.redaction.Redactor.stored`, ``wiring.redactor``: secrets and personal data masked, hashed or
dropped, what was done recorded in the payload's ``$redactions``), then chained, folded and stored in its sealed form
(:func:`agentlog.core.sealing.seal_event`, under its run's data key), so nothing past the sequencer holds a
host's content in plaintext, nor what the policy removes in any form. Both steps are deterministic, so a redelivered
record is stored byte-identically. A run's key is minted at its first accepted event and its keyring record is
committed in the same transaction as the first record sealed under it; a rejection's
original bytes are sealed under a key of their own, linked to their run (``rejections/<runId>``), so that
a run that never got a valid first event still has its bytes erasable. The sequencer waits for the keyring
to be loaded before its first batch: a redelivered record must be sealed again under the key it had.

Signed checkpoints: where a run is due one (every ``checkpoint_every`` events
and at every terminal event, :func:`agentlog.core.checkpoint.is_due`), the sequencer —
the one place that knows an event's chain hash and state hash together — signs
``(runId, sequence, headHash, stateHash)`` and sends it to ``checkpoints`` with the log
record. Ed25519 signatures are deterministic, so a redelivered batch re-sends the same bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentlog.core.checkpoint import is_due, sign_checkpoint
from agentlog.core.keyring import KeyRecord
from agentlog.core.lifetimes import CLOSE_PREFIX, CloseRequest, closed_marker, read_close_request
from agentlog.core.runstate import (
    RUN_STATE_UNAVAILABLE,
    TERMINAL_TYPES,
    RunRecord,
    Unfoldable,
    fold_next,
)
from agentlog.core.sealing import ERASED, DataKey, seal_event, seal_value
from agentlog.core.sequencing import (
    REJECTION_CONTENT,
    REJECTIONS_PREFIX,
    Accepted,
    Handled,
    IndexLookup,
    Redelivered,
    RunHead,
    Source,
    rejection_record,
    rejection_sealing,
    sequence,
)
from agentlog.metrics import METRICS
from agentlog.schemas.records import run_snapshot
from agentlog.streams.codec import encode_committed, encode_record
from agentlog.worker import runstate
from agentlog.worker.lifetimes import Lifetimes
from agentlog.worker.lifetimes import install as install_lifetimes
from agentlog.worker.owned import Owned
from agentlog.worker.ports import GROUP_SEP, Acked, SourceRecord
from agentlog.worker.signing import load_or_create_signing_key
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.sequencer")

#: Separates runId and eventId in the ``index`` table's keys: the batch's key group (a close lists a run's keys).
INDEX_SEP = GROUP_SEP

#: A run's state goes to ``snapshots`` every this many events (and at its terminal event): a replay or
#: rebuild from a mid-run offset folds at most this many events past the snapshot before it, while a
#: snapshot record per 100 events is a small share of the outputs.
SNAPSHOT_EVERY = 100


class Staging(Protocol):
    """What the sequencer's work needs of a batch: reads through its own writes, staged writes, outputs.

    :class:`agentlog.worker.txruntime.TxBatch` (one Kafka transaction) is the one.
    """

    partition: int
    collected: list[Any]
    wiring: Wiring

    def get(self, table: str, key: str) -> Any: ...

    def set(self, table: str, partition: int, key: str, value: Any) -> None: ...

    def keys_from(self, table: str, prefix: str) -> list[str]: ...

    async def send(self, short: str, key: str | None, value: bytes, *, want: bool = False,
                   on_acked: Acked | None = None) -> Awaitable[Any] | None: ...


#: The sequencer's per-record work and its batch hooks.
StagingHandler = Callable[[Staging, SourceRecord], Awaitable[None]]
StagingHook = Callable[[Staging], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SequencerAgent:
    """The sequencer's per-record work and its batch hooks, for its runtime to run.

    ``handle`` per record, ``before_commit`` once a batch's records are handled (its snapshots, which
    name their log records' offsets), ``after_commit`` once the batch is durable (lifetimes, verdicts).
    """

    handle: StagingHandler
    before_commit: StagingHook
    after_commit: StagingHook
    lifetimes: Lifetimes


def build(wiring: Wiring, owned: Owned, *, replay: bool = True) -> SequencerAgent:
    """The sequencer's work on ``wiring`` (its run-lifetime sweep registered on the runner); ``replay=False`` leaves
    host-replay verdicts out.

    ``owned``: the ingest partitions its runtime holds, whose runs the lifetimes sweep asks closes for.
    """
    settings = wiring.settings
    max_bytes = settings.max_event_bytes
    snapshot_every, handoff_mode = SNAPSHOT_EVERY, settings.handoff_mode
    checkpoint_every, signer = settings.checkpoint_every, load_or_create_signing_key(settings)
    remember = _remember(wiring)
    lifetimes = Lifetimes(wiring, owned)
    install_lifetimes(wiring, lifetimes)
    verdicts = runstate.Verdicts(wiring) if replay else None

    keyring, keyring_ready = wiring.keyring, wiring.keyring_ready
    assert keyring is not None, "the sequencer needs the worker's keyring"
    redactor = wiring.redactor
    by_class = bool(redactor.policy.metrics_only_classes)

    def started(doc: dict[str, Any] | None) -> dict[str, Any]:
        payload = doc.get("payload") if doc is not None and doc.get("type") == "run.started" else None
        return payload if isinstance(payload, dict) else {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) and value else None

    def class_of(run_id: str, doc: dict[str, Any] | None) -> str | None:
        """The run's class: its ``run.started``'s ``runClass``, else its parent's; later, its key record's."""
        payload = started(doc)
        if not payload:
            return keyring.run_class(run_id)
        parent = text(payload.get("parentRunId"))
        return text(payload.get("runClass")) or (keyring.run_class(parent) if parent else None)

    def redacted(doc: dict[str, Any]) -> dict[str, Any]:
        return redactor.stored(doc, class_of(doc["runId"], doc) if by_class else None)

    def key_of(run_id: str, doc: dict[str, Any] | None, minted: list[KeyRecord]) -> DataKey:
        """``run_id``'s data key, minted (and noted in ``minted``) if it has none yet."""
        key = keyring.data_key(run_id)
        if key is None:
            payload = started(doc)
            parent = text(payload.get("parentRunId"))
            if run_id.startswith(REJECTIONS_PREFIX):
                parent = run_id[len(REJECTIONS_PREFIX):] or None
            key, rec = keyring.mint(run_id, text(payload.get("subjectId")), parent,
                                    run_class=class_of(run_id, doc) if payload else None)
            minted.append(rec)
        return key

    async def send_keys(batch: Staging, minted: list[KeyRecord]) -> None:
        for rec in minted:
            await batch.send("keyring", rec.run_id, rec.to_value())
        minted.clear()

    async def reject(batch: Staging, reason: str, detail: str, record: SourceRecord, source: Source,
                     doc: dict[str, Any] | None, *, quotes_content: bool = False) -> None:
        """A rejection record with the original bytes redacted and sealed, and the detail too where it quotes what
        the host sent (``quotes_content``); for a run that was erased, those read ``[erased]``."""
        members = REJECTION_CONTENT if quotes_content else ("raw",)
        rejected = rejection_record(reason, detail, record.value, source, doc, record.key)
        run_id = rejected["runId"]
        sealed_under, place = rejection_sealing(rejected)
        stored = redactor.rejection(rejected, members, keyring.run_class(run_id) if by_class and run_id else None)
        if run_id is not None and keyring.erased(run_id):
            stored.update(dict.fromkeys(members, ERASED))
        else:
            minted: list[KeyRecord] = []
            key = key_of(sealed_under, None, minted)
            await send_keys(batch, minted)
            for member in members:
                stored[member] = seal_value(stored[member], key, sealed_under, place, (member,))
        await batch.send("rejections", run_id, encode_record(stored))
        METRICS.inc("agentlog_events_rejected_total", reason=reason)

    async def handle(batch: Staging, record: SourceRecord) -> None:
        if not keyring_ready.is_set():
            await keyring_ready.wait()
        source = Source(record.topic, record.partition, record.offset, record.timestamp_ms)
        if record.value[:1] == CLOSE_PREFIX[:1] and (request := read_close_request(record.value)) is not None:
            close(batch, source, request)
            return
        read: dict[str, RunRecord | None] = {}  # the run record the decision was made on, folded next

        def head_of(run_id: str) -> RunHead | None:
            rec = read[run_id] = batch.get("runs", run_id)
            return None if rec is None else {"next": rec["next"], "hash": rec["head"]}

        def lookup_of(run_id: str) -> IndexLookup:
            return lambda event_id: batch.get("index", run_id + INDEX_SEP + event_id)

        minted: list[KeyRecord] = []
        decoded = sequence(record.value, head_of, lookup_of, source, max_bytes=max_bytes,
                           closed_of=lambda run_id: batch.get("closed", run_id), erased_of=keyring.erased,
                           seal=lambda doc: seal_event(redacted(doc), key_of(doc["runId"], doc, minted)))
        await send_keys(batch, minted)  # before any record sealed under them (the outbox sends them first)
        decision, doc = decoded.decision, decoded.doc
        if decoded.unexpected is not None:
            log.error("unexpected error on %s", source, exc_info=decoded.unexpected)
        if isinstance(decision, Accepted):
            committed = decision.committed
            doc = committed["doc"]
            run_id, seq = doc["runId"], doc["sequence"]
            adv = fold_next(read[run_id], doc, committed["hash"],
                            snapshot_every=snapshot_every, handoff_mode=handoff_mode, ts_ms=source.timestamp_ms)
            if isinstance(adv, Unfoldable):
                await refuse(batch, record, source, doc, adv)
                return
            # The doc's JCS bytes were computed once, for its chain hash; the record is built around them.
            value = encode_committed(decision.doc_bytes, committed["prevHash"], committed["hash"],
                                     committed["source"], adv.state_hash)
            # Only a snapshot needs to know where its log record landed (a future per record costs).
            logged = await batch.send("log", run_id, value, want=adv.snapshot, on_acked=remember)
            event_id, entry = decision.index_entry
            batch.set("index", source.partition, run_id + INDEX_SEP + event_id, entry)
            METRICS.inc("agentlog_events_accepted_total")
            if is_due(seq, doc["type"], checkpoint_every):
                signed = sign_checkpoint(signer.key, kid=signer.key_id, run_id=run_id, sequence=seq,
                                         head_hash=committed["hash"], state_hash=adv.state_hash)
                await batch.send("checkpoints", run_id, encode_record(signed))
                METRICS.inc("agentlog_checkpoints_signed_total")
            await _folded(batch, source.partition, run_id, doc, adv.record, adv.sends, adv.state_hash,
                          logged if adv.snapshot else None, replay=replay)
        elif isinstance(decision, Redelivered | Handled):  # committed before: nothing to write again
            METRICS.inc("agentlog_redelivered_total")
        else:
            await reject(batch, decision.reason, decision.detail, record, source, doc,
                         quotes_content=decision.quotes_content)
            if decision.reason == "duplicate_event_id":
                METRICS.inc("agentlog_duplicates_dropped_total")

    async def refuse(batch: Staging, record: SourceRecord, source: Source, doc: dict[str, Any],
                     why: Unfoldable) -> None:
        """An accepted event its run's state cannot take: to ``rejections``, nothing of it in the log or tables.

        Neither its index entry nor the run's record moves, so the run's log stays as it was and the
        event, sent again, is decided again.
        """
        log.error("run %s: event %s at sequence %d refused: %s", doc["runId"], doc["eventId"], doc["sequence"],
                  why.detail)
        await reject(batch, RUN_STATE_UNAVAILABLE, why.detail, record, source, doc, quotes_content=True)

    def close(batch: Staging, source: Source, request: CloseRequest) -> None:
        """Close the run of a close request: a marker first, then its index and record deleted.

        A request the run has moved on from (another event since) or that finds it closed does nothing.
        """
        run_id, partition = request["runId"], source.partition
        rec = batch.get("runs", run_id)
        if rec is None or rec["next"] != request["next"]:
            batch.collected.append(("closed" if rec is None else "stale", run_id))
            return
        batch.set("closed", partition, run_id, closed_marker(request, rec["head"], source.offset))
        for key in batch.keys_from("index", run_id + INDEX_SEP):
            batch.set("index", partition, key, None)
        batch.set("runs", partition, run_id, None)
        batch.collected.append(("closed", run_id))
        METRICS.inc("agentlog_runs_closed_total", reason=request["reason"])

    async def _folded(batch: Staging, partition: int, run_id: str, doc: dict[str, Any], new: RunRecord,
                      sends: list[Any], state_hash: str, logged: Awaitable[Any] | None, *, replay: bool) -> None:
        for short, key, out in sends:
            await batch.send(short, key, encode_record(out))
            runstate.count(short, out)
        batch.set("runs", partition, run_id, new)
        batch.collected.append(("head", run_id, new, partition))
        if logged is not None:  # a snapshot names its log offset: made once the log record is acknowledged
            batch.collected.append(("snapshot", run_id, doc["sequence"], new["state"], state_hash, new["head"],
                                    logged))
        replay_of = (new["state"] or {}).get("replayOf")
        if replay and replay_of and doc["type"] in TERMINAL_TYPES:
            batch.collected.append(("verdict", {"replayRunId": run_id, **replay_of}))

    async def snapshots(batch: Staging) -> None:
        for item in batch.collected:
            if item[0] != "snapshot":
                continue
            _, run_id, seq, state, state_hash, head, logged = item
            meta = await logged
            await batch.send("snapshots", run_id, encode_record(run_snapshot(
                run_id=run_id, at_sequence=seq, log_partition=meta.partition, log_offset=meta.offset,
                state=state, state_hash=state_hash, head_hash=head)))
            METRICS.inc("agentlog_snapshots_total")

    async def after(batch: Staging) -> None:
        for item in batch.collected:
            if item[0] == "head":
                lifetimes.track(item[3], item[1], item[2])
            elif item[0] == "closed":
                lifetimes.forget(item[1])
            elif item[0] == "stale":
                lifetimes.unask(item[1])
            elif item[0] == "verdict" and verdicts is not None:
                verdicts.ask(item[1])

    return SequencerAgent(handle=handle, before_commit=snapshots, after_commit=after, lifetimes=lifetimes)


def _remember(wiring: Wiring) -> Callable[[int, int, bytes], None]:
    """Note each log record for the log check as soon as the broker acknowledges it (before the check can read it)."""
    add = wiring.own_log.add

    def remember(partition: int, offset: int, value: bytes) -> None:
        add(partition, offset)

    return remember
