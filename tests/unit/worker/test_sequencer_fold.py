"""The sequencer commits an event only with its fold: every log record carries its state hash (no broker).

The sequencer agent runs as the worker runs it (:func:`agentlog.worker.sequencer.build` on the transactional
runtime) in :class:`agentlog.worker.memory.MemoryWorker`: ingest records in as one fetched batch, what the batch's
transaction commits (outputs, changelog records, the ingest position) read back from the memory log, tables in
RocksDB under ``tmp_path``. An accepted event whose run state is missing, behind or past the run's head, or whose
fold raises, is refused (``run_state_unavailable``): to rejections with its bytes, nothing in the log, the head
unmoved. Expected state hashes come from the reference path (``states_by_index``), not from the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agentlog.core.runstate as core_runstate
from agentlog.core.fold import states_by_index
from agentlog.core.sealing import seal_event
from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import sequencer
from agentlog.worker.memory import MemoryWorker, memory_wiring
from agentlog.worker.sequencer import INDEX_SEP
from agentlog.worker.txlog import LogRecord, MemoryLog
from tests.unit.replay.runs import llm_run

INGEST = "agentlog.ingest"


class Fed:
    """What one feed of records committed: ``(short topic, key, decoded record)`` per output, topic by topic."""

    def __init__(self, sent: list[tuple[str, str | None, dict[str, Any]]]) -> None:
        self.sent = sent


def _worker(home, log: MemoryLog | None = None) -> MemoryWorker:
    """A worker running the sequencer (``log``: another worker's log, this one another member of its group)."""
    worker = MemoryWorker(memory_wiring(Settings(home=home), log=log))
    worker.sequencer()
    return worker


@pytest.fixture
def worker(monkeypatch, tmp_path) -> MemoryWorker:
    """The worker the sequencer agent runs on, across feeds."""
    monkeypatch.setattr(sequencer, "SNAPSHOT_EVERY", 1000)
    return _worker(tmp_path)


def _outputs(worker: MemoryWorker) -> dict[str, int]:
    """How many committed records each of the worker's topics but ingest (the sequencer's input) holds."""
    return {short: len(worker.records(short)) for short in worker.wiring.topics if short != "ingest"}


def _since(worker: MemoryWorker, before: dict[str, int]) -> Fed:
    return Fed([(short, r.key.decode() if r.key is not None else None, decode_record(r.value))
                for short, n in before.items() for r in worker.records(short)[n:]])


def _feed(worker: MemoryWorker, docs: list[dict[str, Any]]) -> Fed:
    """Hand the sequencer ``docs`` as the next records of ``ingest[0]``, one batch; what it committed."""
    before = _outputs(worker)
    asyncio.run(worker.feed("sequencer", [encode_json(doc) for doc in docs]))
    return _since(worker, before)


def _logged(batch: Fed) -> list[dict[str, Any]]:
    return [v for short, _, v in batch.sent if short == "log"]


def _stored_states(batch: Fed) -> list[str]:
    """The state hash at every index of the logged docs, refolded from their stored (sealed) form."""
    return [h for _, h in states_by_index([r["doc"] for r in _logged(batch)])]


def _changelog(worker: MemoryWorker, table: str) -> list[LogRecord]:
    """The committed changelog records of one of the sequencer's tables (what a restore of it reads)."""
    topic = worker.wiring.tables[table].changelog  # type: ignore[attr-defined]
    return asyncio.run(worker.log.read({(topic, 0): 0}))[(topic, 0)]


def test_every_committed_record_carries_the_state_hash_at_its_index(worker):
    docs = llm_run("seq-fold")
    batch = _feed(worker, docs)
    logged = _logged(batch)
    assert [r["stateHash"] for r in logged] == _stored_states(batch)
    # the state hash covers the stored form: content sealed, which opens back to what was sent
    assert [r["doc"] for r in logged] != docs
    assert [worker.wiring.keyring.open(r["doc"]) for r in logged] == docs
    assert [s[1] for s in batch.sent if s[0] == "keyring"] == [docs[0]["runId"]]  # one key, minted once
    assert not [s for s in batch.sent if s[0] == "rejections"]


def test_an_event_whose_fold_raises_is_refused_and_taken_once_the_fold_works(worker, monkeypatch):
    docs = llm_run("seq-raises")
    k = 5
    _feed(worker, docs[:k])
    real = core_runstate.fold

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a fold bug")

    monkeypatch.setattr(core_runstate, "fold", broken)
    refused = _feed(worker, docs[k:k + 1])
    [(short, _, rejection)] = [out for out in refused.sent if out[0] != "keyring"]
    assert (short, rejection["reason"]) == ("rejections", "run_state_unavailable")
    assert rejection["raw"] != docs[k] and "$sealed" in rejection["raw"]  # the original bytes, sealed
    assert "$sealed" in rejection["detail"]  # the detail too: a contract error can quote content
    keyring = worker.wiring.keyring
    assert "failed (RuntimeError: a fold bug)" in keyring.open_rejection(rejection)["detail"]

    monkeypatch.setattr(core_runstate, "fold", real)
    taken = _feed(worker, docs[k:])
    stored = [keyring.open(r["doc"]) for r in _logged(taken)]
    assert stored == docs[k:]
    assert [r["stateHash"] for r in _logged(taken)] == [h for _, h in states_by_index(
        [*[seal_event(d, keyring.data_key(d["runId"])) for d in docs[:k]],
         *[r["doc"] for r in _logged(taken)]])][k:]


def test_a_batch_commits_its_log_records_with_its_table_writes_or_nothing_and_a_redelivery_sends_nothing(
        monkeypatch, tmp_path):
    """End to end on the memory log: a batch fenced before it commits leaves no output, no table write and no
    position; the partition's new owner reads its records again and commits them, its tables with them."""
    monkeypatch.setattr(sequencer, "SNAPSHOT_EVERY", 1000)
    docs = llm_run("seq-e2e")
    run_id = docs[0]["runId"]
    zombie = _worker(tmp_path / "zombie")
    asyncio.run(zombie.take("sequencer"))
    owner = _worker(tmp_path / "owner", zombie.log)
    asyncio.run(owner.take("sequencer"))  # the partition's writer opened again: the zombie's is fenced

    before = _outputs(owner)
    asyncio.run(zombie.feed("sequencer", [encode_json(doc) for doc in docs]))
    assert _since(owner, before).sent == []  # nothing of the batch is committed: no log record, no key
    assert _changelog(owner, "index") == _changelog(owner, "runs") == []  # no table write
    assert asyncio.run(owner.log.position(INGEST, 0)) is None  # no position
    assert zombie.wiring.keyring.data_key(run_id) is None  # the key it minted is not kept: the owner mints it

    assert asyncio.run(owner.poll("sequencer")) == len(docs)  # read again from the committed position (none)
    again = _since(owner, before)
    assert [r["stateHash"] for r in _logged(again)] == _stored_states(again)
    assert [owner.wiring.keyring.open(r["doc"]) for r in _logged(again)] == docs
    assert [s[1] for s in again.sent if s[0] == "keyring"] == [run_id]
    index, runs = owner.wiring.tables["index"], owner.wiring.tables["runs"]
    assert len(list(index.keys_from(0, run_id + INDEX_SEP))) == len(docs)  # type: ignore[attr-defined]
    assert runs.get(0, run_id)["next"] == len(docs)
    assert asyncio.run(owner.log.position(INGEST, 0)) == len(docs)
    assert len(_changelog(owner, "index")) == len(docs) and _changelog(owner, "runs") != []

    # Delivered again once committed (the consumer sought back): decided as done, nothing sent again.
    durable = _outputs(owner)
    assert asyncio.run(owner.poll("sequencer", start=0)) == len(docs)
    assert _since(owner, durable).sent == []


def test_a_sequencer_check_keeps_its_detail_readable_for_the_host(worker):
    """A sequence gap names ids and numbers only: its detail stays clear (``agentlog publish`` shows it to the host);
    the original bytes are sealed all the same."""
    docs = llm_run("seq-gap")
    _feed(worker, docs[:1])
    refused = _feed(worker, docs[2:3])
    [(_, _, rejection)] = [out for out in refused.sent if out[0] == "rejections"]
    assert rejection["reason"] == "sequence_gap"
    assert rejection["detail"] == "run seq-gap: expected sequence 1, got 2 (missing 1..1)"
    assert "$sealed" in rejection["raw"]
