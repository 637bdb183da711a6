"""The sequencer commits an event only with its fold: every log record carries its state hash (no broker).

The agent's ``handle`` is taken from :func:`processors.worker.sequencer.install` and fed ingest
records through an in-memory twin of its batch (tables as dicts, sends recorded). An accepted
event whose run state is missing, behind or past the run's head, or whose fold raises, is refused
(``run_state_unavailable``): to rejections with its bytes, nothing in the log, the head unmoved.
Expected state hashes come from the reference path (``states_by_index``), not from the worker.
"""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest

import processors.core.runstate as core_runstate
from processors.core.fold import states_by_index
from processors.metrics import METRICS
from processors.worker import sequencer
from processors.worker.batch import SourceRecord
from streams.codec import decode_record, encode_json
from streams.settings import Settings
from tests.unit.replay.runs import llm_run


class _Batch:
    """What ``handle`` uses of :class:`processors.worker.batch.Batch`: tables read and written, outputs sent."""

    def __init__(self, tables: dict[str, dict[str, Any]]) -> None:
        self.tables = tables
        self.sent: list[tuple[str, str | None, dict[str, Any]]] = []
        self.collected: list[Any] = []

    def get(self, table: str, key: str) -> Any:
        return self.tables[table].get(key)

    def set(self, table: str, partition: int, key: str, value: Any) -> None:
        if value is None:
            self.tables[table].pop(key, None)
        else:
            self.tables[table][key] = value

    def keys_from(self, table: str, prefix: str) -> list[str]:
        return sorted(k for k in self.tables[table] if k.startswith(prefix))

    async def send(self, short: str, key: str | None, value: bytes, **_: Any) -> None:
        self.sent.append((short, key, decode_record(value)))


@pytest.fixture
def worker(monkeypatch, tmp_path):
    """(handle, tables): the sequencer's handler and the tables it keeps, across batches."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(sequencer, "batched_agent", lambda _wiring, _topic, **kw: captured.update(kw))
    monkeypatch.setattr(sequencer, "Lifetimes", lambda _wiring: None)
    monkeypatch.setattr(sequencer, "install_lifetimes", lambda _wiring, _lifetimes: None)
    monkeypatch.setattr(sequencer, "SNAPSHOT_EVERY", 1000)
    sequencer.install(SimpleNamespace(settings=Settings(home=tmp_path), written={}), replay=False)
    tables: dict[str, dict[str, Any]] = {"heads": {}, "index": {}, "runs": {}, "closed": {}}
    return captured["handle"], tables


def _feed(worker, docs: list[dict[str, Any]], first_offset: int = 0) -> _Batch:
    handle, tables = worker
    batch = _Batch(tables)
    for i, doc in enumerate(docs):
        record = SourceRecord(topic="t.ingest", partition=0, offset=first_offset + i, timestamp_ms=0,
                              value=encode_json(doc))
        asyncio.run(handle(batch, record))
    return batch


def _logged(batch: _Batch) -> list[dict[str, Any]]:
    return [v for short, _, v in batch.sent if short == "log"]


def test_every_committed_record_carries_the_state_hash_at_its_index(worker):
    docs = llm_run("seq-fold")
    batch = _feed(worker, docs)
    assert [r["stateHash"] for r in _logged(batch)] == [h for _, h in states_by_index(docs)]
    assert not [s for s in batch.sent if s[0] == "rejections"]


@pytest.mark.parametrize("lost", ["missing", "behind", "past"])
def test_an_event_its_run_state_is_not_just_before_is_refused_and_the_log_stays_as_it_was(worker, lost):
    docs = llm_run(f"seq-{lost}")
    k = 8
    _, tables = worker
    _feed(worker, docs[:k])
    head = dict(tables["heads"][docs[0]["runId"]])
    if lost == "missing":  # a run past its first event with no run state: a table lost
        del tables["runs"][docs[0]["runId"]]
    else:  # behind (a fold that failed) or past (a table that disagrees with the head)
        tables["runs"][docs[0]["runId"]] = {**tables["runs"][docs[0]["runId"]], "next": k - 1 if lost == "behind"
                                            else k + 1}
    refused0 = METRICS.get("agentlog_events_rejected_total", reason="run_state_unavailable")

    batch = _feed(worker, docs[k:k + 1], first_offset=k)
    assert _logged(batch) == []
    [(short, key, rejection)] = batch.sent
    assert (short, key, rejection["reason"], rejection["sequence"]) == ("rejections", docs[0]["runId"],
                                                                        "run_state_unavailable", k)
    assert "the event is not appended, because every log record carries the state hash" in rejection["detail"]
    assert base64.b64decode(rejection["raw"]) == encode_json(docs[k])
    assert tables["heads"][docs[0]["runId"]] == head  # the run's head did not move
    assert not any(key.endswith(docs[k]["eventId"]) for key in tables["index"])
    assert METRICS.get("agentlog_events_rejected_total", reason="run_state_unavailable") == refused0 + 1
    # sent again, it is decided again (not a duplicate), and refused again while the run state stays so
    again = _feed(worker, docs[k:k + 1], first_offset=k + 1)
    assert [(s, v["reason"]) for s, _, v in again.sent] == [("rejections", "run_state_unavailable")]


def test_an_event_whose_fold_raises_is_refused_and_taken_once_the_fold_works(worker, monkeypatch):
    docs = llm_run("seq-raises")
    k = 5
    _feed(worker, docs[:k])
    real = core_runstate.fold

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a fold bug")

    monkeypatch.setattr(core_runstate, "fold", broken)
    refused = _feed(worker, docs[k:k + 1], first_offset=k)
    [(short, _, rejection)] = refused.sent
    assert (short, rejection["reason"]) == ("rejections", "run_state_unavailable")
    assert "failed (RuntimeError: a fold bug)" in rejection["detail"]

    monkeypatch.setattr(core_runstate, "fold", real)
    taken = _feed(worker, docs[k:], first_offset=k + 1)
    assert [r["stateHash"] for r in _logged(taken)] == [h for _, h in states_by_index(docs)][k:]
