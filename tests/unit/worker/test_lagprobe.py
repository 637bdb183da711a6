"""The loop-lag probe reports a stall of the event loop with the code that caused it."""

from __future__ import annotations

import asyncio
import time

from agentlog.worker.lagprobe import LoopLagProbe


def blocking_the_loop_on_purpose(probe: LoopLagProbe) -> None:
    """Hold the loop until the watchdog has sampled this stack twice (however long a loaded machine takes)."""
    give_up, start = time.perf_counter() + 60, probe.samples
    while probe.samples < start + 2 and time.perf_counter() < give_up:
        pass


def test_a_stall_is_reported_with_its_length_and_the_blocking_function():
    probe = LoopLagProbe(20)

    async def scenario() -> None:
        probe.target = __import__("threading").get_ident()
        probe.start()
        beat = asyncio.ensure_future(probe.beat())
        try:
            await asyncio.sleep(0.05)
            blocking_the_loop_on_purpose(probe)
            await asyncio.sleep(0.05)
        finally:
            beat.cancel()
            probe.stop()

    asyncio.run(scenario())
    # other stalls may be reported (a loaded machine can hold the loop back): exactly one is ours
    ours = [s for s in probe.stalls if any("blocking_the_loop_on_purpose" in stack for _, stack in s[2])]
    assert len(ours) == 1
    _, took, stacks = ours[0]
    assert took >= probe.threshold_s  # reported only past the threshold
    assert stacks and "blocking_the_loop_on_purpose" in stacks[0][1]


def test_off_by_default():
    from agentlog.worker import lagprobe

    assert lagprobe.STALL_LOG_MS == 0
    assert lagprobe.install(object()) is None
