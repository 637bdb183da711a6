"""Keep Python's garbage collector from pausing the worker for a large part of a second at a time.

The worker's heap holds long-lived objects that reference counting frees when they are replaced: the
tables' decoded caches, the state hasher's memo, Faust's and the Kafka clients' own (~240,000 tracked
objects at 800 ev/s of realistic runs). CPython's generation-2 collection walks every one of them; such
a collection took 0.4-0.7 s under load, and those pauses decide the p99 of publish → log latency
(tests/bench/JOURNAL.md). Walking them again and again finds nothing.

:class:`GcPacer` does three things, all with the standard :mod:`gc` API:

* every :data:`FREEZE_EVERY_S`: a young collection, then :func:`gc.freeze`, which moves every
  object still tracked into the permanent generation that no collection walks. Frozen objects
  are still freed by reference counting as usual; only a *reference cycle* frozen while alive
  and dropped later would stay in memory;
* Python's own generation-2 trigger is switched off (threshold :data:`GEN2_THRESHOLD`): with
  the heap frozen, its "a quarter more long-lived objects than at the last full collection"
  rule fired every few seconds (measured: 33 collections of 50-250 ms over 200k events);
* every :data:`FULL_EVERY_S`: :func:`gc.unfreeze` and one full collection, which reclaims such
  cycles: one pause per period.

So a cycle made per event or per batch stays in memory, with all it holds, for up to a period: the
per-event paths make none (``tests/unit/worker/test_no_cycles.py``; the store's inserts hand the
client a list they empty afterwards, since its insert context is a cycle). Made per event, they were
most of the soak's growth (tests/bench/JOURNAL.md).
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from agentlog.metrics import METRICS
from agentlog.worker.ports import Runner

log = logging.getLogger("agentlog.worker")

#: A collection longer than this is logged (it shows up in publish → log latency).
SLOW_COLLECTION_S = 0.05

#: 1 s: a young collection and a freeze each second keep what survived out of every later walk (measured
#: without it: 38 full collections of up to 1.3 s over 200k events). 0: Python's own schedule.
FREEZE_EVERY_S = 1.0
#: 30 min: one full collection per period reclaims the reference cycles frozen meanwhile (RSS after 100k
#: and 200k events the same with and without freezing, tests/bench/JOURNAL.md). 0: never.
FULL_EVERY_S = 1800.0


#: Generation-1 collections before Python considers a full one: in effect never (the full tick does it).
GEN2_THRESHOLD = 1_000_000


class GcPacer:
    """The worker's collector schedule (see the module docstring); ``tick()`` is called by a timer."""

    def __init__(self, *, freeze_every_s: float, full_every_s: float, clock: Any = time.monotonic) -> None:
        self.freeze_every_s = freeze_every_s
        self.full_every_s = full_every_s
        self._thresholds = gc.get_threshold()
        self._clock = clock
        now = clock()
        self._next_full = now + full_every_s if full_every_s > 0 else float("inf")
        self._started: dict[int, float] = {}
        # Collections seen since the last tick, per generation: [count, seconds]. Python collects
        # generation 0 hundreds of times a second under load; the metrics are updated once per tick.
        self._seen: dict[int, list[float]] = {}

    @property
    def enabled(self) -> bool:
        return self.freeze_every_s > 0

    def start(self) -> None:
        """Leave generation 2 to :meth:`tick` (when freezing); time collections (metrics, slow ones logged)."""
        self._thresholds = gc.get_threshold()
        if self.enabled:
            gen0, gen1, _ = self._thresholds
            gc.set_threshold(gen0, gen1, GEN2_THRESHOLD)
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)

    def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        self._publish()
        gc.set_threshold(*self._thresholds)
        gc.unfreeze()

    def tick(self) -> str:
        """Freeze what survived so far, or (once per ``full_every_s``) collect everything; says which."""
        if not self.enabled:
            return "off"
        now = self._clock()
        if now >= self._next_full:
            self._next_full = now + self.full_every_s
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            METRICS.inc("agentlog_gc_full_collections_total")
            # Counting the frozen objects walks all of them (``gc.get_freeze_count`` is a list walk):
            # done at the full tick only, which walks the whole heap anyway. Done every tick it costs
            # ~4% of the worker's main thread at 300k frozen objects, growing with the heap.
            METRICS.set("agentlog_gc_frozen_objects", gc.get_freeze_count())
            done = "full"
        else:
            gc.collect(1)
            gc.freeze()
            done = "freeze"
        self._publish()
        return done

    def _publish(self) -> None:
        seen, self._seen = self._seen, {}
        for generation, (count, seconds) in seen.items():
            METRICS.inc("agentlog_gc_pause_seconds_total", seconds, generation=str(generation))
            METRICS.inc("agentlog_gc_collections_total", int(count), generation=str(generation))

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        generation = int(info.get("generation", 0))
        if phase == "start":
            self._started[generation] = time.perf_counter()
            return
        started = self._started.pop(generation, None)
        if started is not None:
            took = time.perf_counter() - started
            if took > SLOW_COLLECTION_S:
                log.warning("garbage collection of generation %d took %.0f ms (%s objects frozen)",
                            generation, took * 1000, gc.get_freeze_count())
            seen = self._seen.get(generation)
            if seen is None:
                self._seen[generation] = [1, took]
            else:
                seen[0] += 1
                seen[1] += took
            if not self.enabled:  # no tick publishes them
                self._publish()


def install(runner: Runner) -> GcPacer:
    """Start the pacer with the worker (a timer on its event loop)."""
    pacer = GcPacer(freeze_every_s=FREEZE_EVERY_S, full_every_s=FULL_EVERY_S)

    async def gc_pacer_start() -> None:
        pacer.start()

    runner.task(gc_pacer_start)
    if pacer.enabled:
        async def gc_pacer_tick() -> None:
            pacer.tick()

        runner.timer(FREEZE_EVERY_S, gc_pacer_tick)

    return pacer
