"""Say where the worker's event loop stalls: a 1 ms heartbeat and a watchdog thread.

Publish → log latency at low load is decided by pauses of the worker's event loop: a record
that arrives while the loop runs something else for 100 ms waits those 100 ms. Which code
runs then is what an operator needs to know, and a profile averages it away. With
:data:`STALL_LOG_MS` above 0 (off by default; set it while diagnosing stalls):

* a task on the loop sleeps 1 ms at a time and notes when it last woke (the heartbeat);
* a daemon thread checks the heartbeat every millisecond or so. While it is older than the
  threshold, it samples the main thread's stack (``sys._current_frames()`` through
  :func:`agentlog.streams.internals.thread_frame`) every few ms; when the loop wakes again it logs the stall's
  length and the stacks it saw most often, innermost frames first.

Sampling reads frames only and takes no lock the loop holds, so it costs the loop nothing
between stalls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import traceback

from agentlog.metrics import METRICS
from agentlog.streams import internals
from agentlog.worker.ports import Runner

log = logging.getLogger("agentlog.worker")

#: Log every stall of the worker's event loop longer than this many ms, with its stacks; 0 = no probe
#: (the heartbeat costs a wake-up per ms, so it runs only while someone is diagnosing stalls).
STALL_LOG_MS = 0.0
#: The heartbeat's sleep, and how often the watchdog looks at it.
BEAT_S = 0.001
#: How often a stalled loop's stack is sampled.
SAMPLE_S = 0.005
#: Frames kept per sample (innermost first) and distinct stacks logged per stall.
FRAMES = 14
STACKS = 3


class LoopLagProbe:
    """The heartbeat (:meth:`beat`, a task on the loop) and the watchdog thread (:meth:`watch`)."""

    def __init__(self, threshold_ms: float, *, target: int | None = None) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.target = target if target is not None else threading.main_thread().ident
        self.last = time.perf_counter()
        self.stalls: list[tuple[float, float, list[tuple[int, str]]]] = []  # (wall start, seconds, stacks)
        #: stacks sampled so far (a stall is being watched once it moves)
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def beat(self) -> None:
        while True:
            self.last = time.perf_counter()
            await asyncio.sleep(BEAT_S)

    def start(self) -> None:
        self.last = time.perf_counter()
        self._thread = threading.Thread(target=self.watch, name="agentlog-loop-lag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog; a stall it was watching is reported before this returns."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def watch(self) -> None:
        while not self._stop.wait(BEAT_S):
            seen = self.last
            if time.perf_counter() - seen <= self.threshold_s:
                continue
            wall = time.time() - (time.perf_counter() - seen)
            samples: collections.Counter[str] = collections.Counter()
            while self.last == seen and not self._stop.is_set():
                stack = self.sample()
                self.samples += 1
                if stack:
                    samples[stack] += 1
                time.sleep(SAMPLE_S)
            took = self.last - seen
            self.stalled(wall, took, [(n, s) for s, n in samples.most_common(STACKS)])

    def sample(self) -> str:
        """The target thread's stack now, innermost frame first, one ``file:line function`` per line."""
        frame = internals.thread_frame(self.target)
        if frame is None:
            return ""
        frames = traceback.extract_stack(frame)[-FRAMES:]
        return "\n".join(f"    {_short(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))

    def stalled(self, wall: float, took: float, stacks: list[tuple[int, str]]) -> None:
        self.stalls.append((wall, took, stacks))
        if len(self.stalls) > 1000:
            del self.stalls[:500]
        METRICS.inc("agentlog_loop_stalls_total")
        METRICS.inc("agentlog_loop_stall_seconds_total", took)
        shown = "\n".join(f"  {n} sample(s):\n{s}" for n, s in stacks) or "  (no sample)"
        log.warning("event loop stalled %.0f ms at %s; stacks seen:\n%s", took * 1000,
                    time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall * 1000) % 1000:03d}", shown)


def _short(path: str) -> str:
    for marker in ("site-packages/", "/processors/", "/streams/", "/schemas/"):
        at = path.rfind(marker)
        if at >= 0:
            return path[at + len(marker):] if marker == "site-packages/" else path[at + 1:]
    return path


def install(runner: Runner) -> LoopLagProbe | None:
    """Start the probe with the worker when :data:`STALL_LOG_MS` > 0."""
    if STALL_LOG_MS <= 0:
        return None
    probe = LoopLagProbe(STALL_LOG_MS)

    async def loop_lag_probe() -> None:
        probe.target = threading.get_ident()  # the thread running Faust's loop
        probe.start()
        try:
            await probe.beat()
        finally:
            probe.stop()

    runner.task(loop_lag_probe)
    return probe
