"""The run-state catch-up is bounded: a read of the log that stalls is abandoned and tried again.

The catch-up runs inside the sequencer's batch, so a read that never finishes would hold the
whole partition (the stall seen once in CI, session 4). Here ``read_run`` is replaced by a read
that hangs — the broker side is not what is under test, the bound around it is.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from processors.core.runstate import advance
from processors.worker import runstate
from schemas.canonical import GENESIS, chain_hash
from streams.settings import Settings
from tests.unit.replay.runs import llm_run


def _committed(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    head, out = GENESIS, []
    for doc in docs:
        h = chain_hash(head, doc)
        out.append({"doc": doc, "prevHash": head, "hash": h})
        head = h
    return out


def _fold(records: list[dict[str, Any]], settings: Settings) -> Any:
    rec = None
    for r in records:
        rec = advance(rec, r["doc"], r["hash"], snapshot_every=settings.snapshot_every,
                      handoff_mode=settings.handoff_mode).record
    return rec


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch):
    """(settings, wiring, records, calls): ``read_run`` hangs on the calls listed in ``hang_on``."""
    monkeypatch.setattr(runstate, "_HOPELESS", set())
    settings = Settings().replace(catch_up_timeout_s=0.2, catch_up_attempts=3)
    records = _committed(llm_run("cu-1"))
    calls: list[int] = []
    hang_on: set[int] = set()

    async def read_run(_settings: Settings, run_id: str, *, progress: Any = None, **_: Any) -> list[dict]:
        calls.append(len(calls) + 1)
        if progress is not None:
            progress.stage = "fetching"
        if len(calls) in hang_on:
            await asyncio.Event().wait()  # never set: the stall
        return [r for r in records if r["doc"]["runId"] == run_id]

    monkeypatch.setattr(runstate, "read_run", read_run)
    return settings, SimpleNamespace(settings=settings), records, calls, hang_on


def test_a_stalled_read_is_read_again_and_the_run_is_caught_up(run, caplog):
    settings, wiring, records, calls, hang_on = run
    hang_on.update({1})
    lag, head = 3, 9
    rec = _fold(records[:lag], settings)
    with caplog.at_level(logging.WARNING, logger="agentlog.runstate"):
        got = asyncio.run(runstate.catch_up(wiring, None, "cu-1", rec, head))
    assert calls == [1, 2]
    assert got == _fold(records[:head], settings)
    assert any("stalled for 0.2 s at stage fetching" in m and "attempt 2 of 3" in m for m in caplog.messages)


def test_a_read_that_always_stalls_gives_up_with_where_it_stalled(run, caplog):
    settings, wiring, records, calls, hang_on = run
    hang_on.update({1, 2, 3})
    rec = _fold(records[:3], settings)
    with caplog.at_level(logging.WARNING, logger="agentlog.runstate"):
        got = asyncio.run(runstate.catch_up(wiring, None, "cu-1", rec, 9))
    assert got is None and calls == [1, 2, 3]
    assert any("gave up after 3 attempts" in (r.exc_text or "") for r in caplog.records)
    # Not retried for every later event of the run.
    assert asyncio.run(runstate.catch_up(wiring, None, "cu-1", rec, 10)) is None and calls == [1, 2, 3]


def test_a_read_that_finishes_is_used_once(run):
    settings, wiring, records, calls, _ = run
    got = asyncio.run(runstate.catch_up(wiring, None, "cu-1", None, 5))
    assert calls == [1] and got == _fold(records[:5], settings)
