"""Soak: the default ``agentlog worker`` (one process: agents, audit sink, chdb) under a steady realistic load.

The realistic workload (:mod:`tests.bench.workload`: runs that finish, 1,000 trees in flight) is
published at ``RATE`` events/s for the soak's length (``AGENTLOG_BENCH_SOAK_S``, default 1,800 s;
180 s with --quick) while the worker's resident memory (VmRSS) is sampled every 30 s. A run
closes ``GRACE_S`` after its terminal event, so the runs in flight stay about constant and so
should the memory: the figure is the RSS at the end against the RSS once warmed up (after a
sixth of the soak), a ratio near 1 meaning flat.

Baseline, in the same run on the same broker: the Faust pass-through agent under the same load,
its RSS at the end (what a Faust process that keeps nothing costs).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from pathlib import Path

from streams.admin import ensure_topics
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


def _soak(settings, args: list[str], log: Path, seconds: float, tag: str) -> list[tuple[float, float]]:
    """RSS samples (seconds since start, MB) of the process ``args`` while the workload runs for ``seconds``."""
    asyncio.run(ensure_topics(settings))
    proc = _start(settings, args, log)
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    t0 = time.monotonic()

    def sample() -> None:
        while not done.wait(30.0):
            rss = _rss_mb(proc.pid)
            if rss is not None:
                samples.append((round(time.monotonic() - t0, 1), round(rss, 1)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        time.sleep(10)  # started and in its group before the load begins
        asyncio.run(publish(settings, f"soak-{tag}", int(RATE * seconds), concurrent=1000, rate=RATE))
        if proc.poll() is not None:
            raise RuntimeError(f"the process died during the soak; see {log}")
    finally:
        done.set()
        sampler.join()
        _stop(proc)
    return samples


def run(ctx: BenchContext) -> dict:
    seconds = float(os.environ.get("AGENTLOG_BENCH_SOAK_S", 180 if ctx.quick else 1800))
    tag = uuid.uuid4().hex[:6]
    home = REPO / ".agentlog" / "bench" / f"soak-{tag}"
    s = ctx.settings.replace(topic_prefix=f"benchsoak{tag}", home=home, partitions=4, replication_factor=1,
                             web_enabled=False, otlp_port=0, run_grace_s=GRACE_S)
    ours = _soak(s, ["-m", "processors", "worker", "--role", "all", "--no-web"], home / "worker.log", seconds, tag)
    p = ctx.settings.replace(topic_prefix=f"benchsoakpass{tag}", home=home / "pass", partitions=4,
                             replication_factor=1, web_enabled=False, otlp_port=0)
    passthrough = _soak(p, PASSTHROUGH_ARGS, home / "passthrough.log", seconds, tag)
    warm = [mb for at, mb in ours if at >= seconds / 6]
    end = ours[-1][1] if ours else None
    return {
        "ours": end,
        "baseline": passthrough[-1][1] if passthrough else None,
        "unit": "MB RSS at the end",
        "goal_ratio": None,
        "details": {"seconds": seconds, "rate_events_per_s": RATE, "events": int(RATE * seconds),
                    "grace_s": GRACE_S, "rss_mb_samples": ours, "passthrough_rss_mb_samples": passthrough,
                    "end_over_warm": (end / warm[0]) if warm and end else None,
                    "warm_max_over_min": (max(warm) / min(warm)) if warm else None, "goal_end_over_warm": 1.1},
    }
