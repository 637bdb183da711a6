"""Adaptive batches: a pile of busy ticks is handled once the stream falls quiet.

The streams are in-memory ones (:class:`agentlog.worker.memory.MemoryStream`: only ``take_events``
ticks matter to :func:`agentlog.worker.batch._adaptive`); the real worker's batches are covered by
``tests/integration/worker/test_adaptive_batches.py``.
"""

from __future__ import annotations

import asyncio

from agentlog.worker.batch import _adaptive
from agentlog.worker.memory import MemoryStream

WINDOW_S = 1.0


def _ending_after(stream: MemoryStream, s: float) -> MemoryStream:
    """``stream``, closed after ``s`` at the latest (a test that never closes it ends all the same)."""
    asyncio.get_running_loop().call_later(s, stream.close)
    return stream


async def _handled_after(quiet_s: float) -> tuple[float, list[list[int]]]:
    loop = asyncio.get_running_loop()
    # One busy tick (more than ``idle_events`` records), then nothing until the first batch is handled.
    stream = _ending_after(MemoryStream(list(range(40))), WINDOW_S * 2)
    batches: list[list[int]] = []
    started = loop.time()
    took: list[float] = []

    async def process(events: list[int]) -> None:
        batches.append(events)
        took.append(loop.time() - started)
        stream.close()

    await _adaptive(stream, process, max_events=1000, tick_s=0.005, window_s=WINDOW_S, idle_events=16,
                    quiet_s=quiet_s)
    return took[0], batches


def test_a_burst_before_silence_is_handled_when_the_stream_is_quiet_not_when_the_window_closes():
    took, batches = asyncio.run(_handled_after(0.02))
    assert batches == [list(range(40))]
    assert took < WINDOW_S / 2


def test_without_a_quiet_time_the_burst_waits_for_the_window():
    took, batches = asyncio.run(_handled_after(0.0))
    assert batches == [list(range(40))]
    assert took >= WINDOW_S * 0.9


async def _batches_of_small_ticks(behind, idle_events: int = 16) -> list[list[int]]:
    # Ticks of a few records each (what Faust hands a 5 ms tick even with a backlog), then silence.
    stream = _ending_after(MemoryStream(*[[t * 4 + i for i in range(4)] for t in range(10)], pace_s=0.001),
                           WINDOW_S * 2)
    batches: list[list[int]] = []

    async def process(events: list[int]) -> None:
        batches.append(events)
        if sum(map(len, batches)) == 40:
            stream.close()

    await _adaptive(stream, process, max_events=1000, tick_s=0.005, window_s=WINDOW_S, idle_events=idle_events,
                    quiet_s=0.05, behind=behind)
    return batches


def test_small_ticks_are_handled_at_once_when_the_broker_holds_nothing_more():
    batches = asyncio.run(_batches_of_small_ticks(lambda events: False))
    assert len(batches) == 10 and all(len(b) == 4 for b in batches)


def test_small_ticks_pile_up_while_the_broker_holds_more_of_their_partitions():
    # The broker is ahead until the tick bringing record 35: the ticks up to it pile into one batch,
    # handled with that tick; the last tick is quiet again.
    batches = asyncio.run(_batches_of_small_ticks(lambda events: events[-1] < 35))
    assert batches == [list(range(36)), list(range(36, 40))]


def test_with_idle_events_zero_no_tick_is_quiet_small_ticks_pile_up_until_the_stream_falls_silent():
    batches = asyncio.run(_batches_of_small_ticks(lambda events: False, idle_events=0))
    assert batches == [list(range(40))]


def test_the_broker_is_ahead_when_a_partition_of_the_tick_has_enough_records_beyond_its_last():
    from agentlog.worker.batch import broker_ahead
    from agentlog.worker.memory import MemorySource, TopicPartition, event

    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    source = MemorySource(highwaters={p0: 10, p1: 120})
    assert not broker_ahead(source, [event("t", 0, 8), event("t", 0, 9)], 16)  # p0 read to its end
    assert broker_ahead(source, [event("t", 0, 9), event("t", 1, 100)], 16)  # p1 holds 19 more
    assert not broker_ahead(source, [event("t", 1, 104)], 16)  # 15 more: below the threshold
    assert not broker_ahead(source, [event("t", 2, 0)], 16)  # no high watermark known yet
    assert not broker_ahead(MemorySource(), [event("t", 1, 0)], 16)  # a consumer that has fetched nothing
