"""Soak: the default ``agentlog worker`` (one process: agents, audit sink, chdb) under a steady realistic load.

The realistic workload (:mod:`tests.bench.workload`: runs that finish, 1,000 trees in flight) is
published at ``RATE`` events/s for the soak's length (``AGENTLOG_BENCH_SOAK_S``, default 1,800 s;
180 s with --quick) while the worker's resident memory (VmRSS) is sampled every 30 s
(``AGENTLOG_BENCH_SOAK_ROLE`` soaks another role than ``all``). A run closes ``GRACE_S`` after its
terminal event, so the runs in flight stay about constant and so should the memory: the figure is
the RSS at the end against the RSS once warmed up (after a sixth of the soak), near 1 meaning flat.
Beside it, the median of the last sixth's samples against the median of the second sixth's: the
embedded ClickHouse's merges lift single samples by up to ~300 MB for a few seconds.

Baseline, in the same run on the same broker and at the same time (its own topics and publisher):
the Faust pass-through agent under the same load, its RSS at the end (what a Faust process that
keeps nothing costs).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentlog.streams.admin import ensure_topics
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from tests.bench import PASSTHROUGH_ARGS, BenchContext
from tests.bench.bench_process import REPO, _start, _stop
from tests.bench.workload import publish

RATE = 800.0
GRACE_S = 30.0


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


class _Soak:
    """One process under the workload: started, fed at ``RATE`` for ``seconds``, its RSS sampled every 30 s."""

    def __init__(self, settings, args: list[str], log: Path, seconds: float, tag: str) -> None:
        asyncio.run(ensure_topics(settings))
        self.settings, self.log, self.seconds, self.tag = settings, log, seconds, tag
        self.proc = _start(settings, args, log)
        self.samples: list[tuple[float, float]] = []
        self.error: BaseException | None = None
        self.logged = 0  # log records at the end (the process kept up when it is every event)

    def feed(self) -> None:
        try:
            asyncio.run(publish(self.settings, f"soak-{self.tag}", int(RATE * self.seconds), concurrent=1000,
                                rate=RATE))
        except BaseException as e:  # reported by run()
            self.error = e

    def sample(self, t0: float) -> None:
        rss = _rss_mb(self.proc.pid)
        if rss is not None:
            self.samples.append((round(time.monotonic() - t0, 1), round(rss, 1)))


async def _logged(settings) -> int:
    """The ``log`` topic's end offsets, summed: its records, and one commit marker per transaction that wrote it."""
    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None)
    await consumer.start()
    try:
        topic = topic_name(settings, "log")
        parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
        return sum((await consumer.end_offsets(parts)).values())
    finally:
        await consumer.stop()


def _soak_both(soaks: list[_Soak]) -> None:
    """Feed every process at once (each its own topics and publisher) and sample them together."""
    time.sleep(10)  # started and in their groups before the load begins
    feeders = [threading.Thread(target=s.feed, daemon=True) for s in soaks]
    t0 = time.monotonic()
    for f in feeders:
        f.start()
    try:
        while any(f.is_alive() for f in feeders):
            for f in feeders:
                f.join(timeout=30.0 / len(feeders))
            for s in soaks:
                s.sample(t0)
        for s in soaks:
            if s.error is not None:
                raise s.error
            if s.proc.poll() is not None:
                raise RuntimeError(f"a process died during the soak; see {s.log}")
        time.sleep(5)
        for s in soaks:
            s.logged = asyncio.run(_logged(s.settings))
    finally:
        for s in soaks:
            _stop(s.proc)


def _sixths_median_ratio(samples: list[tuple[float, float]], seconds: float) -> float | None:
    """Median RSS of the soak's last sixth over the median of its second sixth (the first after warm-up)."""
    def median(lo: float, hi: float) -> float | None:
        values = sorted(mb for at, mb in samples if lo <= at <= hi)
        return values[len(values) // 2] if values else None

    warm, end = median(seconds / 6, seconds / 3), median(seconds * 5 / 6, seconds)
    return end / warm if warm and end else None


def run(ctx: BenchContext) -> dict:
    seconds = float(os.environ.get("AGENTLOG_BENCH_SOAK_S", 180 if ctx.quick else 1800))
    tag = uuid.uuid4().hex[:6]
    home = REPO / ".agentlog" / "bench" / f"soak-{tag}"
    s = ctx.on_own_topics(f"benchsoak{tag}", home, run_grace_s=GRACE_S)
    p = ctx.on_own_topics(f"benchsoakpass{tag}", home / "pass")
    role = os.environ.get("AGENTLOG_BENCH_SOAK_ROLE", "all")
    worker = _Soak(s, ["-m", "agentlog", "worker", "--role", role, "--no-web"], home / "worker.log", seconds, tag)
    passthrough = _Soak(p, PASSTHROUGH_ARGS, home / "passthrough.log", seconds, tag)
    _soak_both([worker, passthrough])
    ours = worker.samples
    warm = [mb for at, mb in ours if at >= seconds / 6]
    end = ours[-1][1] if ours else None
    return {
        "ours": end,
        "baseline": passthrough.samples[-1][1] if passthrough.samples else None,
        "unit": "MB RSS at the end",
        "goal_ratio": None,
        "details": {"role": role, "seconds": seconds, "rate_events_per_s": RATE, "events": int(RATE * seconds),
                    "grace_s": GRACE_S, "logged_at_end": worker.logged,
                    "passthrough_logged_at_end": passthrough.logged, "rss_mb_samples": ours, "passthrough_rss_mb_samples": passthrough.samples,
                    "end_over_warm": (end / warm[0]) if warm and end else None,
                    "median_end_over_warm": _sixths_median_ratio(ours, seconds),
                    "warm_max_over_min": (max(warm) / min(warm)) if warm else None, "goal_end_over_warm": 1.1},
    }
