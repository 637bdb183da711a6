"""The worker's per-event paths leave no reference cycle behind (no broker).

The worker freezes what survives each second and runs a full collection rarely (:mod:`agentlog.worker.gcpause`),
so an unreachable cycle made per event or per batch stays in memory, with whatever it holds (a run's data key, a
batch's spans), until then: the soak's memory grows with it. Reference counting must free everything these paths
make: with the collector off, a collection afterwards finds nothing.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

from agentlog.core.otel import map_trace
from agentlog.streams.settings import Settings
from agentlog.worker.memory import MemoryWorker, memory_wiring
from tests.bench.workload import events
from tests.unit.core.test_otel import spans  # noqa: F401  (the fixture: the demo planner's spans, real OTel SDK)


@contextmanager
def _cycles() -> Iterator[list[object]]:
    """What the block leaves to the collector: the objects of the cycles it made and dropped."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[object] = []
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _kinds(objects: list[object]) -> set[str]:
    return {getattr(o, "__qualname__", type(o).__name__) for o in objects}


def test_sequencing_realistic_runs_leaves_no_cycle(tmp_path):
    worker = MemoryWorker(memory_wiring(Settings(home=tmp_path)))
    worker.sequencer()
    values = [value for _, value in events("cycles", 3_000, concurrent=200)]

    async def feed(batch: list[bytes]) -> None:
        await worker.feed("sequencer", batch)

    asyncio.run(feed(values[:500]))  # the agent's own objects, made once
    with _cycles() as found:
        for i in range(500, len(values), 500):
            asyncio.run(feed(values[i:i + 500]))
    assert len(worker.values("log")) == len(values)
    assert _kinds(found) == set()


def test_mapping_a_trace_leaves_no_cycle(spans):  # noqa: F811
    trace = spans[0]["traceId"]
    with _cycles() as found:
        for _ in range(10):
            docs = map_trace(trace, {s["spanId"]: s for s in spans}, published={}, cursors={}).docs
    assert docs
    assert _kinds(found) == set()
