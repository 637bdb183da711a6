"""The loop-lag probe (#13 session 7) reports a stall of the event loop with the code that caused it."""

from __future__ import annotations

import asyncio
import time

from processors.worker.lagprobe import LoopLagProbe


def blocking_the_loop_on_purpose(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_stall_is_reported_with_its_length_and_the_blocking_function():
    probe = LoopLagProbe(20)

    async def scenario() -> None:
        probe.target = __import__("threading").get_ident()
        probe.start()
        beat = asyncio.ensure_future(probe.beat())
        try:
            await asyncio.sleep(0.05)  # quiet: beats every ms, nothing reported
            assert probe.stalls == []
            blocking_the_loop_on_purpose(0.12)
            await asyncio.sleep(0.05)
        finally:
            beat.cancel()
            probe.stop()

    asyncio.run(scenario())
    assert len(probe.stalls) == 1
    _, took, stacks = probe.stalls[0]
    assert 0.1 <= took < 0.5
    assert stacks and "blocking_the_loop_on_purpose" in stacks[0][1]


def test_off_by_default():
    from processors.worker import lagprobe
    from streams.settings import Settings

    assert Settings().loop_lag_log_ms == 0
    assert lagprobe.install(object(), Settings()) is None
