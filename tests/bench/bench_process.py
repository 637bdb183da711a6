"""Processing throughput: the agentlog worker vs a raw aiokafka loop vs a naive Faust agent.

All three consume the same N pre-published events (own topic prefix each, same
partitions, same broker) and do the same work per event: decode + validate, the
sequencer's decision, the shared fold, the state hash, and produce the committed
record and the state digest (acks=all). Throughput = N / (last output record's
broker timestamp − first output record's timestamp), so process start-up and
group join are not counted for anyone.

- ``ours``: ``agentlog worker --no-sink`` (batched agents, changelog-backed tables).
- ``raw``: one aiokafka consumer + producer in this process, state in dicts, no tables.
- ``naive``: a Faust agent handling one event at a time with per-event table writes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.admin import ensure_topics
from streams.publisher import Publisher
from streams.reader import _partitions
from streams.settings import Settings, settings_env
from streams.topics import topic_name
from tests.bench import BenchContext

RUNS = 200
REPO = Path(__file__).resolve().parents[2]


async def _publish(settings: Settings, n: int) -> None:
    async with Publisher(settings, wire="avro") as pub:
        runs = [pub.run(f"proc-run-{r}") for r in range(RUNS)]
        await runs[0].emit("run.started", {"bindings": {"engineVersion": "bench"}})
        for r in runs[1:]:
            await r.emit("run.started", {"bindings": {"engineVersion": "bench"}})
        for i in range(n - RUNS):
            run = runs[i % RUNS]
            await run.emit("variable.changed", {"name": f"v{i % 13}", "value": i})
        await pub.flush()


async def _span(settings: Settings, short: str, n: int, timeout: float, proc=None) -> float:
    """Seconds between the first and the n-th record (broker timestamps) on a topic; waits for n."""
    topic = topic_name(settings, short)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in await _partitions(consumer, topic, settings)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        stamps: list[int] = []
        deadline = time.monotonic() + timeout
        while len(stamps) < n and time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the process under test exited with {proc.returncode}; see its log")
            batches = await consumer.getmany(timeout_ms=500, max_records=20000)
            for messages in batches.values():
                stamps.extend(m.timestamp for m in messages)
        if len(stamps) < n:
            raise RuntimeError(f"only {len(stamps)}/{n} records on {topic} after {timeout}s")
        stamps.sort()
        return max(1e-3, (stamps[n - 1] - stamps[0]) / 1000.0)
    finally:
        await consumer.stop()


def _run_subprocess(settings: Settings, args: list[str], n: int, log: Path) -> float:
    env = {**os.environ, **settings_env(settings)}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        return asyncio.run(_span(settings, "digests", n, timeout=600, proc=proc))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def _raw(settings: Settings, n: int) -> float:
    from processors.core.fold import fold, state_hash
    from processors.core.sequencing import Accepted, Source, decide
    from schemas.validate import validate_doc
    from streams.codec import decode_ingest, encode_record

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True,
                                linger_ms=5, max_batch_size=1 << 20)
    await consumer.start()
    await producer.start()
    heads: dict[str, dict] = {}
    index: dict[str, list] = {}
    states: dict[str, dict] = {}
    log_topic, digest_topic = topic_name(settings, "log"), topic_name(settings, "digests")
    try:
        topic = topic_name(settings, "ingest")
        parts = [TopicPartition(topic, p) for p in await _partitions(consumer, topic, settings)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        done = 0
        while done < n:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            futures = []
            for tp, messages in batches.items():
                for m in messages:
                    doc = validate_doc(decode_ingest(m.value))
                    run_id = doc["runId"]
                    d = decide(heads.get(run_id), lambda e, r=run_id: index.get(r + "\x1f" + e), doc,
                               Source(tp.topic, tp.partition, m.offset, m.timestamp))
                    if not isinstance(d, Accepted):
                        continue
                    heads[run_id] = d.head
                    index[run_id + "\x1f" + d.index_entry[0]] = d.index_entry[1]
                    state, _ = fold(states.get(run_id), doc)
                    states[run_id] = state
                    key = run_id.encode()
                    futures.append(await producer.send(log_topic, encode_record(d.committed), key=key))
                    futures.append(await producer.send(digest_topic, encode_record({
                        "runId": run_id, "sequence": doc["sequence"], "stateHash": state_hash(state),
                        "headHash": d.head["hash"]}), key=key))
                    done += 1
            for f in futures:
                await f
    finally:
        await producer.stop()
        await consumer.stop()
    return await _span(settings, "digests", n, timeout=60)


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    base = ctx.settings
    home = REPO / ".agentlog" / "bench" / f"process-{uuid.uuid4().hex[:6]}"

    def variant(name: str) -> Settings:
        s = base.replace(topic_prefix=f"bench{name}{uuid.uuid4().hex[:6]}", home=home / name, partitions=4,
                         replication_factor=1, web_enabled=False)
        asyncio.run(ensure_topics(s))
        asyncio.run(_publish(s, n))
        return s

    ours_s = variant("ours")
    ours_span = _run_subprocess(ours_s, ["-m", "processors", "worker", "--no-sink", "--no-web"], n,
                                home / "ours.log")
    raw_s = variant("raw")
    raw_span = asyncio.run(_raw(raw_s, n))
    naive_s = variant("naive")
    naive_span = _run_subprocess(naive_s, ["-m", "tests.bench.naive_faust", "worker", "-l", "warn"], n,
                                 home / "naive.log")
    ours, raw, naive = n / ours_span, n / raw_span, n / naive_span
    return {
        "ours": ours,
        "baseline": raw,
        "unit": "events/s",
        "goal_ratio": 0.5,
        "details": {"events": n, "runs": RUNS, "naive_faust_events_per_s": naive,
                    "ours_vs_naive_faust": ours / naive, "goal_events_per_s": 20_000},
    }
