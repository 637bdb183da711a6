"""Publish throughput: the SDK (`Publisher` + `Run.emit`, then flush) vs raw aiokafka.

Both sides: the same broker, fresh topics with the same partition count, the same run
keys in the same round-robin order, the same producer settings (acks=all, idempotence,
linger, batch size). The baseline sends the very bytes the SDK produced, pre-encoded,
so the difference is exactly what the SDK does per event: build the doc (UUIDv7,
timestamp, sequence, causation), validate it, Avro-encode it, track its future.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

from aiokafka import AIOKafkaProducer

from bench import BenchContext
from schemas.avro import encode_avro
from streams.admin import ensure_topics
from streams.publisher import DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH_BYTES, Publisher
from streams.settings import Settings
from streams.topics import topic_name

RUNS = 64  # distinct run keys, spread over the partitions by the default partitioner


def _payload(i: int) -> dict:
    # ~200 bytes on the wire: a typical variable/channel update, not a whole LLM transcript.
    return {"name": f"var{i % 17}", "value": {"step": i, "note": "observation " * 8, "score": i / 7}}


async def _sdk(settings: Settings, n: int) -> tuple[float, list[dict]]:
    async with Publisher(settings, wire="avro") as pub:
        runs = [pub.run(f"bench-run-{r}") for r in range(RUNS)]
        docs = []
        t0 = time.perf_counter()
        for i in range(n):
            docs.append(await runs[i % RUNS].emit("variable.changed", _payload(i)))
        await pub.flush()
        elapsed = time.perf_counter() - t0
    return n / elapsed, docs


async def _raw(settings: Settings, encoded: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=DEFAULT_LINGER_MS,
        max_batch_size=DEFAULT_MAX_BATCH_BYTES,
        max_request_size=settings.max_event_bytes + 64 * 1024,
    )
    topic = topic_name(settings, "ingest")
    await producer.start()
    try:
        futures = []
        t0 = time.perf_counter()
        for key, value in encoded:
            futures.append(await producer.send(topic, value=value, key=key))
        await producer.flush()
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - t0
    finally:
        await producer.stop()
    return len(encoded) / elapsed


async def _round(base: Settings, n: int) -> tuple[float, float]:
    tag = uuid.uuid4().hex[:8]
    sdk_settings = base.replace(topic_prefix=f"bench-{tag}-sdk")
    raw_settings = base.replace(topic_prefix=f"bench-{tag}-raw")
    await ensure_topics(sdk_settings)
    await ensure_topics(raw_settings)
    sdk_rate, docs = await _sdk(sdk_settings, n)
    encoded = [(d["runId"].encode(), encode_avro(d)) for d in docs]
    raw_rate = await _raw(raw_settings, encoded)
    return sdk_rate, raw_rate


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    rounds = 1 if ctx.quick else 3
    settings = ctx.settings.replace(partitions=4)
    asyncio.run(_round(settings, 2_000))  # warm-up: JIT-free, but connections, imports, broker page cache
    sdk, raw = [], []
    for _ in range(rounds):
        s, r = asyncio.run(_round(settings, n))
        sdk.append(s)
        raw.append(r)
    return {
        "ours": statistics.median(sdk),
        "baseline": statistics.median(raw),
        "unit": "events/s",
        "goal_ratio": 0.6,
        "details": {
            "events": n,
            "rounds": rounds,
            "runs": RUNS,
            "partitions": settings.partitions,
            "linger_ms": DEFAULT_LINGER_MS,
            "max_batch_bytes": DEFAULT_MAX_BATCH_BYTES,
            "sdk_rounds": sdk,
            "raw_rounds": raw,
        },
    }
