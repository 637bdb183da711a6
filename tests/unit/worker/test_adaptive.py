"""Adaptive batches (#13 session 7): a pile of busy ticks is handled once the stream falls quiet.

The stream here stands in for Faust's (only ``take_events`` ticks matter to
:func:`processors.worker.batch._adaptive`); the real worker's batches are covered by
``tests/integration/worker/test_adaptive_batches.py``.
"""

from __future__ import annotations

import asyncio
import contextlib

from processors.worker.batch import _adaptive

WINDOW_S = 1.0


class BurstThenSilence:
    """One busy tick (more than ``idle_events`` records), then nothing until told to end."""

    def __init__(self, burst: int) -> None:
        self.burst = burst
        self.end = asyncio.Event()

    def take_events(self, max_events: int, within: float):
        async def ticks():
            yield list(range(self.burst))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.end.wait(), WINDOW_S * 2)

        return ticks()


async def _handled_after(quiet_s: float) -> tuple[float, list[list[int]]]:
    loop = asyncio.get_running_loop()
    stream = BurstThenSilence(40)
    batches: list[list[int]] = []
    started = loop.time()
    took: list[float] = []

    async def process(events: list[int]) -> None:
        batches.append(events)
        took.append(loop.time() - started)
        stream.end.set()

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
