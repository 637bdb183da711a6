"""The worker's collector schedule: freeze what survived, reclaim frozen cycles on the full tick."""

from __future__ import annotations

import gc
import weakref

import pytest

from agentlog.worker.gcpause import GEN2_THRESHOLD, GcPacer


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def pacer_clock():
    clock = _Clock()
    before = gc.get_threshold()
    pacer = GcPacer(freeze_every_s=5.0, full_every_s=60.0, clock=clock)
    pacer.start()
    try:
        yield pacer, clock
    finally:
        pacer.stop()
    assert gc.get_threshold() == before  # stop() restores Python's schedule


def test_freeze_hides_survivors_and_the_full_tick_reclaims_a_frozen_cycle(pacer_clock) -> None:
    pacer, clock = pacer_clock
    assert gc.get_threshold()[2] == GEN2_THRESHOLD  # generation 2 waits for the full tick
    cycle = _Node()
    ref = weakref.ref(cycle)
    clock.now = 5.0
    assert pacer.tick() == "freeze"
    assert gc.get_freeze_count() > 0
    del cycle
    gc.collect()  # a frozen cycle is out of every collection's sight …
    assert ref() is not None
    clock.now = 60.0
    assert pacer.tick() == "full"  # … until the full tick unfreezes and collects
    assert ref() is None
    assert gc.get_freeze_count() > 0  # and freezes again what is left


def test_frozen_objects_are_still_freed_by_reference_counting(pacer_clock) -> None:
    pacer, clock = pacer_clock
    table_value = _Weakable({"state": [1, 2, 3]})  # what a table holds: no cycle
    ref = weakref.ref(table_value)
    clock.now = 5.0
    pacer.tick()  # frozen while alive
    del table_value  # replaced in the table: freed at once, without any collection
    assert ref() is None


class _Weakable:
    def __init__(self, payload: object) -> None:
        self.payload = payload


def test_zero_turns_it_off() -> None:
    before = gc.get_threshold()
    pacer = GcPacer(freeze_every_s=0, full_every_s=0)
    pacer.start()
    try:
        assert gc.get_threshold() == before
        assert pacer.tick() == "off"
        assert gc.get_freeze_count() == 0
    finally:
        pacer.stop()


def test_the_freeze_tick_does_not_count_the_frozen_objects(pacer_clock, monkeypatch) -> None:
    # Counting walks every frozen object (30–40 ms for 2M on the project's machine): on the
    # every-second tick it stalled the worker's event loop as long as the collections it avoids.
    pacer, clock = pacer_clock
    walked: list[int] = []
    real = gc.get_freeze_count
    monkeypatch.setattr(gc, "get_freeze_count", lambda: walked.append(1) or real())
    for second in range(1, 6):
        clock.now = float(second * 5)
        assert pacer.tick() == "freeze"
    assert walked == []
    clock.now = 60.0
    assert pacer.tick() == "full"
    assert walked  # after the full collection, which walked them anyway (a slow one is logged with the count too)


def test_collections_are_counted_by_the_tick_not_one_metric_update_each(pacer_clock) -> None:
    """Generation-0 collections run hundreds of times a second: the callback only adds them up."""
    from agentlog.metrics import METRICS

    pacer, clock = pacer_clock
    before = METRICS.get("agentlog_gc_collections_total", generation="0")
    for _ in range(3):
        gc.collect(0)
    assert METRICS.get("agentlog_gc_collections_total", generation="0") == before  # not yet published
    clock.now = 5.0
    assert pacer.tick() == "freeze"
    assert METRICS.get("agentlog_gc_collections_total", generation="0") >= before + 3
    assert METRICS.get("agentlog_gc_pause_seconds_total", generation="0") > 0


def test_collections_are_counted_at_once_when_the_pacer_is_off() -> None:
    from agentlog.metrics import METRICS

    pacer = GcPacer(freeze_every_s=0, full_every_s=0)
    pacer.start()
    try:
        before = METRICS.get("agentlog_gc_collections_total", generation="0")
        gc.collect(0)
        assert METRICS.get("agentlog_gc_collections_total", generation="0") >= before + 1
    finally:
        pacer.stop()
