"""Restart: a stopped worker, started again, commits a new event how soon — after H historical events?

The realistic workload (:mod:`tests.bench.workload`, runs that finish) is published and handled by
``agentlog worker --role process`` with a short grace (5 s); once the group has committed all of ingest
(the history's close requests included) the worker is stopped (SIGTERM): every finished run of the
history is closed, and the ~1,000 trees the stream cuts off stay in flight. The worker is started again on the same state directory,
a new tree of runs (33 events) is published at once, and the figure is the time from the start
command to the first of those events in the committed log (its broker timestamp).

Baseline, measured in the same run on the same broker: the Faust pass-through agent started on a
topic holding only those 33 events — Faust's own start-up and group join, with no table to recover.
``AGENTLOG_BENCH_RESTART_EVENTS`` sets H (default 200,000; 20,000 with --quick).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agentlog.streams.admin import ensure_topics
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import reading_group, topic_name
from tests.bench import PASSTHROUGH_ARGS, BenchContext
from tests.bench.bench_process import REPO, _start, _stop, topic_stamps
from tests.bench.workload import TREE_EVENTS, publish

GRACE_S = 5.0


def _first_new(settings, before: int, proc) -> float:
    """Broker timestamp (s) of the first log record beyond the first ``before`` ones."""
    stamps = asyncio.run(topic_stamps(settings, "log", before + TREE_EVENTS, timeout=1800, procs=[proc]))
    return sorted(stamps)[before] / 1000.0 if before else min(stamps) / 1000.0


async def _caught_up(settings, *, quiet_s: float) -> None:
    """Until the worker group has committed all of ingest, and ingest has not grown for ``quiet_s``.

    The close requests of the history's runs follow its last event by the grace period: a restart
    measured before they are handled would measure that backlog, not the restart.
    """
    admin = AIOKafkaAdminClient(**client_kwargs(settings))
    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None)
    await admin.start()
    await consumer.start()
    try:
        topic = topic_name(settings, "ingest")
        parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
        last_end, since = -1, time.monotonic()
        while True:
            end = sum((await consumer.end_offsets(parts)).values())
            offsets = await admin.list_consumer_group_offsets(reading_group(settings, "ingest"), partitions=parts)
            committed = sum(meta.offset for meta in offsets.values() if meta.offset >= 0)
            if end != last_end:
                last_end, since = end, time.monotonic()
            if committed >= end and time.monotonic() - since >= quiet_s:
                return
            await asyncio.sleep(1.0)
    finally:
        await consumer.stop()
        await admin.close()


def run(ctx: BenchContext) -> dict:
    history = int(os.environ.get("AGENTLOG_BENCH_RESTART_EVENTS", 20_000 if ctx.quick else 200_000))
    tag = uuid.uuid4().hex[:6]
    home = REPO / ".agentlog" / "bench" / f"restart-{tag}"
    s = ctx.on_own_topics(f"benchrestart{tag}", home, run_grace_s=GRACE_S)
    asyncio.run(ensure_topics(s))
    asyncio.run(publish(s, f"hist-{tag}", history, concurrent=1000))
    worker = ["-m", "agentlog", "worker", "--role", "process", "--no-web"]
    proc = _start(s, worker, home / "first.log")
    try:
        t0 = time.time()
        stamps = asyncio.run(topic_stamps(s, "log", history, timeout=3600, procs=[proc]))
        handled_s = max(stamps) / 1000.0 - t0
        asyncio.run(_caught_up(s, quiet_s=GRACE_S * 3))  # the close requests too: nothing left to handle
    finally:
        _stop(proc)
    state_bytes = sum(f.stat().st_size for f in (home / "state").rglob("*") if f.is_file())

    started = time.time()
    proc = _start(s, worker, home / "restart.log")
    try:
        asyncio.run(publish(s, f"new-{tag}", TREE_EVENTS, concurrent=1))
        restart_s = _first_new(s, history, proc) - started
    finally:
        _stop(proc)

    p = ctx.on_own_topics(f"benchrestartpass{tag}", home / "pass")
    asyncio.run(ensure_topics(p))
    asyncio.run(publish(p, f"pass-{tag}", TREE_EVENTS, concurrent=1))
    started = time.time()
    proc = _start(p, PASSTHROUGH_ARGS, home / "passthrough.log")
    try:
        passthrough_s = _first_new(p, 0, proc) - started
    finally:
        _stop(proc)
    return {
        "ours": restart_s,
        "baseline": passthrough_s,
        "unit": "s to the first new event (lower is better)",
        "goal_ratio": None,
        "details": {"historical_events": history, "first_pass_s": handled_s,
                    "first_pass_events_per_s": history / max(handled_s, 1e-3), "state_dir_bytes": state_bytes,
                    "goal_s": 10.0 if history <= 200_000 else 15.0, "grace_s": GRACE_S},
    }
