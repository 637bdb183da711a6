"""The sequencer commits an event only with its fold: every log record carries its state hash (no broker).

The sequencer agent runs as the worker runs it (:func:`agentlog.worker.sequencer.install`, the batch
loop, :meth:`Batch.commit`) on the in-memory ports of :mod:`agentlog.worker.memory`: ingest records
in as a stream's tick, outputs and changelog records out through the in-memory producer, tables as
dicts. An accepted event whose run state is missing, behind or past the run's head, or whose fold
raises, is refused (``run_state_unavailable``): to rejections with its bytes, nothing in the log, the
head unmoved. Expected state hashes come from the reference path (``states_by_index``), not from the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agentlog.core.runstate as core_runstate
from agentlog.core.fold import states_by_index
from agentlog.core.sealing import seal_event
from agentlog.metrics import METRICS
from agentlog.streams.codec import decode_record, encode_json
from agentlog.streams.settings import Settings
from agentlog.worker import sequencer
from agentlog.worker.batch import position_key
from agentlog.worker.memory import MemoryStream, Refused, event, memory_wiring, parts
from agentlog.worker.wiring import Wiring
from tests.unit.replay.runs import llm_run

PREFIX = "agentlog."
INGEST = PREFIX + "ingest"


class Fed:
    """What one feed of records sent: ``(short topic, key, decoded record)`` per output, in order."""

    def __init__(self, sent: list[tuple[str, str | None, dict[str, Any]]], raw: list[tuple[str, bytes]]) -> None:
        self.sent = sent
        self.raw = raw  # (short topic, bytes) of every output, for byte-for-byte comparisons


@pytest.fixture
def worker(monkeypatch, tmp_path) -> tuple[Wiring, dict[str, dict[str, Any]]]:
    """The wiring the sequencer agent is installed on, and its tables' contents (live dicts), across feeds."""
    monkeypatch.setattr(sequencer, "SNAPSHOT_EVERY", 1000)
    wiring = memory_wiring(Settings(home=tmp_path), tables=("index", "runs", "closed"))
    sequencer.install(wiring, replay=False)
    return wiring, {name: table.data for name, table in wiring.tables.items()}  # type: ignore[attr-defined]


async def _run(wiring: Wiring, offsets: list[int], values: list[bytes]) -> None:
    """Run the sequencer agent on one tick of ``values`` at ``offsets`` of ``ingest[0]`` until it is durable."""
    _, agent = parts(wiring).runner.agents["sequencer"]
    stream = MemoryStream([event(INGEST, 0, offset, value) for offset, value in zip(offsets, values, strict=True)])
    running = asyncio.ensure_future(agent(stream))
    runs = wiring.tables["runs"]
    while not running.done() and (runs.get(0, position_key(INGEST, 0)) or 0) < offsets[-1] + 1:
        await asyncio.sleep(0.002)
    stream.close()
    await running


def _feed(worker, docs: list[dict[str, Any]], first_offset: int = 0, *,
          offsets: list[int] | None = None) -> Fed:
    wiring, _ = worker
    producer = parts(wiring).producer
    before = len(producer.log)
    offsets = offsets if offsets is not None else [first_offset + i for i in range(len(docs))]
    try:
        asyncio.run(_run(wiring, offsets, [encode_json(doc) for doc in docs]))
    finally:
        outputs = [(entry[1][len(PREFIX):], entry[3], entry[4]) for entry in producer.log[before:]
                   if entry[0] == "sent" and entry[1].startswith(PREFIX)]
        fed = Fed([(short, key.decode() if key is not None else None, decode_record(value))
                   for short, key, value in outputs], [(short, value) for short, _, value in outputs])
        _FED.append(fed)
    return fed


#: Every feed's outputs, the last one also when its agent failed (``_feed`` raised).
_FED: list[Fed] = []


def _logged(batch: Fed) -> list[dict[str, Any]]:
    return [v for short, _, v in batch.sent if short == "log"]


def _stored_states(batch: Fed) -> list[str]:
    """The state hash at every index of the logged docs, refolded from their stored (sealed) form."""
    return [h for _, h in states_by_index([r["doc"] for r in _logged(batch)])]


def test_every_committed_record_carries_the_state_hash_at_its_index(worker):
    wiring, _ = worker
    docs = llm_run("seq-fold")
    batch = _feed(worker, docs)
    logged = _logged(batch)
    assert [r["stateHash"] for r in logged] == _stored_states(batch)
    # the state hash covers the stored form: content sealed, which opens back to what was sent
    assert [r["doc"] for r in logged] != docs
    assert [wiring.keyring.open(r["doc"]) for r in logged] == docs
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
    refused = _feed(worker, docs[k:k + 1], first_offset=k)
    [(short, _, rejection)] = [out for out in refused.sent if out[0] != "keyring"]
    assert (short, rejection["reason"]) == ("rejections", "run_state_unavailable")
    assert rejection["raw"] != docs[k] and "$sealed" in rejection["raw"]  # the original bytes, sealed
    assert "$sealed" in rejection["detail"]  # the detail too: a contract error can quote content
    wiring, _ = worker
    assert "failed (RuntimeError: a fold bug)" in wiring.keyring.open_rejection(rejection)["detail"]

    monkeypatch.setattr(core_runstate, "fold", real)
    taken = _feed(worker, docs[k:], first_offset=k + 1)
    stored = [wiring.keyring.open(r["doc"]) for r in _logged(taken)]
    assert stored == docs[k:]
    assert [r["stateHash"] for r in _logged(taken)] == [h for _, h in states_by_index(
        [*[seal_event(d, wiring.keyring.data_key(d["runId"])) for d in docs[:k]],
         *[r["doc"] for r in _logged(taken)]])][k:]


def test_a_batch_of_ingest_records_goes_out_as_log_records_and_table_writes_and_a_redelivery_is_identical(worker):
    """End to end on the in-memory ports: outputs, then tables; a crash before the tables repeats the same bytes."""
    wiring, tables = worker
    producer = parts(wiring).producer
    docs = llm_run("seq-e2e")
    run_id = docs[0]["runId"]

    producer.refuse = {"index"}  # the outputs are acknowledged, the first table stage is not: a crash
    with pytest.raises(Refused):
        _feed(worker, docs)
    crashed = _FED[-1]
    assert [r["stateHash"] for r in _logged(crashed)] == _stored_states(crashed)
    assert tables["index"] == tables["runs"] == {}  # no table write, no position

    producer.refuse = set()
    again = _feed(worker, docs)  # the same records, delivered again
    # the run's key was acknowledged with the first copy: the second seals under it, byte for byte
    assert [out[0] for out in crashed.raw].count("keyring") == 1 and "keyring" not in [out[0] for out in again.raw]
    assert [out for out in again.raw if out[0] != "snapshots"] == \
           [out for out in crashed.raw if out[0] not in ("snapshots", "keyring")]
    # byte for byte; a snapshot names where its log record landed, which is the second copy's offset now
    assert [{**v, "logOffset": None} for short, _, v in again.sent if short == "snapshots"] == \
           [{**v, "logOffset": None} for short, _, v in crashed.sent if short == "snapshots"] != []
    assert len([k for k in tables["index"] if k.startswith(run_id)]) == len(docs)
    assert tables["runs"][run_id]["next"] == len(docs)
    assert tables["runs"][position_key(INGEST, 0)] == len(docs)
    assert wiring.positions.committable(INGEST, 0, parts(wiring).membership.generation) == len(docs)
    changelog = [topic for kind, topic, *_ in producer.log if kind == "acked" and not topic.startswith(PREFIX)]
    assert changelog == ["index", "runs"]  # the stages in order, after the outputs

    # Redelivered once durable (below the agent's position): decided as done, nothing sent again.
    assert _feed(worker, docs).sent == []


def test_a_crash_between_the_index_and_the_run_record_is_folded_level_by_the_redelivery(worker, tmp_path):
    """The index stage durable, the ``runs`` stage not: the redelivered records fold the run again, once each."""
    wiring, tables = worker
    producer = parts(wiring).producer
    docs = llm_run("seq-refold")
    run_id = docs[0]["runId"]
    clean = memory_wiring(Settings(home=tmp_path / "clean"), tables=("index", "runs", "closed"))
    clean.keyring = wiring.keyring  # the same run keys, so the same sealed state
    sequencer.install(clean, replay=False)
    _feed((clean, None), docs)
    expected = clean.tables["runs"].data[run_id]  # type: ignore[attr-defined]

    producer.refuse = {"runs"}  # outputs and the index stage acknowledged, the run record's stage not
    with pytest.raises(Refused):
        _feed(worker, docs)
    assert len([k for k in tables["index"] if k.startswith(run_id)]) == len(docs) and run_id not in tables["runs"]
    producer.refuse = set()
    refolded = METRICS.get("agentlog_refolded_total")
    again = _feed(worker, docs)  # the same records, delivered again
    assert again.sent == []  # every record Redelivered by its index entry: nothing sent twice
    assert METRICS.get("agentlog_refolded_total") == refolded + len(docs)
    assert tables["runs"][run_id] == expected  # head, state, timestamp: what one clean pass makes


def test_a_sequencer_check_keeps_its_detail_readable_for_the_host(worker):
    """A sequence gap names ids and numbers only: its detail stays clear (``agentlog publish`` shows it to the host);
    the original bytes are sealed all the same."""
    docs = llm_run("seq-gap")
    _feed(worker, docs[:1])
    refused = _feed(worker, docs[2:3], first_offset=1)
    [(_, _, rejection)] = [out for out in refused.sent if out[0] == "rejections"]
    assert rejection["reason"] == "sequence_gap"
    assert rejection["detail"] == "run seq-gap: expected sequence 1, got 2 (missing 1..1)"
    assert "$sealed" in rejection["raw"]
