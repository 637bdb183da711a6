"""``agentlog erase`` of a subject with 1,000 runs (realistic trees), against a raw read of the same log.

One subject owns 334 workload trees (a planner run with LLM calls, tools, usage and handoffs, and its two
child runs: 1,002 runs, ~11k events); another subject owns 100 more trees that must stay readable. The worker
(``--role process``) commits them all, then ``agentlog erase --subject`` runs as a user runs it (a process, its
``--json`` answer timed from outside). The baseline is one plain consumer reading the whole log once (the erase
reads it to count each run's events): what any tool that touches the subject's history pays at least. The goal
is absolute: at most 60 s.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agentlog.streams.admin import ensure_topics, topic_partitions
from agentlog.streams.codec import encode_json
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, settings_env
from agentlog.streams.topics import topic_name
from tests.bench import BenchContext
from tests.bench.bench_process import REPO, _start, _stop, topic_stamps
from tests.bench.workload import tree

#: Trees of the erased subject (3 runs each: 1,002 runs) and of the one that stays.
SUBJECT_TREES, OTHER_TREES = 334, 100


def _runs(prefix: str, subject: str, trees: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for t in range(trees):
        root, *children = tree(f"{prefix}-{t}")
        root[0]["payload"]["subjectId"] = subject
        for child in children:
            child[0]["payload"]["parentRunId"] = root[0]["runId"]
        for run in (root, *children):
            docs.extend(run)
    return docs


async def _publish(settings: Settings, docs: list[dict[str, Any]]) -> None:
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True, linger_ms=5,
                                max_batch_size=1 << 20)
    await producer.start()
    try:
        topic = topic_name(settings, "ingest")
        pending = [await producer.send(topic, encode_json(d), key=d["runId"].encode()) for d in docs]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def _read_log(settings: Settings) -> int:
    """Every record of the log, once, with a plain consumer: the raw read the erase is compared with."""
    topic = topic_name(settings, "log")
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic]))[topic]]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends, n = await consumer.end_offsets(tps), 0
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                n += len(messages)
        return n
    finally:
        await consumer.stop()


def run(ctx: BenchContext) -> dict:
    tag = uuid.uuid4().hex[:6]
    home = REPO / ".agentlog" / "bench" / f"erase-{tag}"
    s = ctx.on_own_topics(f"bencherase{tag}", home)
    asyncio.run(ensure_topics(s))
    trees = (SUBJECT_TREES // 10, OTHER_TREES // 10) if ctx.quick else (SUBJECT_TREES, OTHER_TREES)
    erased = _runs(f"gone-{tag}", "subject-gone@example.com", trees[0])
    kept = _runs(f"kept-{tag}", "subject-kept@example.com", trees[1])
    docs = erased + kept
    asyncio.run(_publish(s, docs))
    proc = _start(s, ["-m", "agentlog", "worker", "--role", "process", "--no-web"], home / "worker.log")
    try:
        asyncio.run(topic_stamps(s, "log", len(docs), timeout=600, procs=[proc]))
        started = time.monotonic()
        records = asyncio.run(_read_log(s))
        raw_s = time.monotonic() - started
        env = {**settings_env(s), "PYTHONPATH": str(REPO)}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "agentlog", "erase", "--subject", "subject-gone@example.com",
                               "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        erase_s = time.monotonic() - started
    finally:
        _stop(proc)
    if done.returncode != 0:
        raise RuntimeError(f"agentlog erase failed: {done.stderr[-2000:]}")
    answer = json.loads(done.stdout)
    runs = [r for r in answer["runs"] if not r.startswith("rejections/")]
    return {
        "ours": erase_s,
        "baseline": raw_s,
        "unit": "s to erase a subject (lower is better; baseline: one raw read of the log)",
        "goal_ratio": None,
        "details": {"goal_s": 60.0, "runs_erased": len(runs), "events_erased": sum(answer["events"].values()),
                    "log_records": records, "erase_reported_s": answer["seconds"],
                    "kept_runs": 3 * trees[1]},
    }
