"""Publish throughput: the SDK (`Publisher` + `Run.emit`, then flush) vs raw aiokafka.

The SDK hands aiokafka whole per-partition batches; the table's baseline is a plain
per-record ``send()``, and the same bytes through aiokafka's batch API are
reported beside it (``raw_batch_api_rounds``), the floor the SDK can approach.

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

from agentlog.schemas.avro import encode_avro
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH_BYTES, Publisher
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import partition_for, topic_name
from tests.bench import BenchContext, own

_avg_value_bytes = 0.0
RUNS = 64  # distinct run keys, spread over the partitions by the default partitioner


def _payload(i: int) -> dict:
    # ~200 bytes on the wire: a typical variable/channel update, not a whole LLM transcript.
    return {"name": f"var{i % 17}", "value": {"step": i, "note": "observation " * 8, "score": i / 7}}


class _Clock:
    """Wall time and this process's CPU time: on a shared machine the CPU figure is the stable one."""

    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


async def _sdk(settings: Settings, n: int) -> tuple[_Clock, list[dict]]:
    payloads = [_payload(i) for i in range(n)]  # built outside the clock: the raw side gets them free too
    async with Publisher(settings, wire="avro") as pub:
        runs = [pub.run(f"bench-run-{r}") for r in range(RUNS)]
        docs = []
        with _Clock() as clock:
            for i in range(n):
                docs.append(await runs[i % RUNS].emit("variable.changed", payloads[i]))
            await pub.flush()
    return clock, docs


async def _raw(settings: Settings, encoded: list[tuple[bytes, bytes]]) -> _Clock:
    producer = AIOKafkaProducer(
        **client_kwargs(settings),
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
        with _Clock() as clock:
            for key, value in encoded:
                futures.append(await producer.send(topic, value=value, key=key))
            await producer.flush()
            await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return clock


async def _raw_batched(settings: Settings, encoded: list[tuple[bytes, bytes]], partitions: list[int]) -> _Clock:
    """The same bytes through aiokafka's batch API (what the SDK itself uses): the floor of the SDK."""
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True,
                                linger_ms=DEFAULT_LINGER_MS, max_batch_size=DEFAULT_MAX_BATCH_BYTES,
                                max_request_size=settings.max_event_bytes + 64 * 1024)
    topic = topic_name(settings, "ingest")
    await producer.start()
    try:
        futures = []
        with _Clock() as clock:
            builders: dict[int, object] = {}
            for (key, value), p in zip(encoded, partitions, strict=True):
                b = builders.get(p) or builders.setdefault(p, producer.create_batch())
                if b.append(key=key, value=value, timestamp=None) is None:  # type: ignore[attr-defined]
                    futures.append(await producer.send_batch(b, topic, partition=p))
                    b = builders[p] = producer.create_batch()
                    b.append(key=key, value=value, timestamp=None)  # type: ignore[attr-defined]
            for p, b in builders.items():
                futures.append(await producer.send_batch(b, topic, partition=p))
            await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return clock


async def _round(base: Settings, n: int) -> tuple[_Clock, _Clock, _Clock]:
    tag = uuid.uuid4().hex[:8]
    sdk_settings = base.replace(topic_prefix=own(f"bench-{tag}-sdk"))
    raw_settings = base.replace(topic_prefix=own(f"bench-{tag}-raw"))
    batched_settings = base.replace(topic_prefix=own(f"bench-{tag}-rawb"))
    await ensure_topics(sdk_settings)
    await ensure_topics(raw_settings)
    await ensure_topics(batched_settings)
    sdk, docs = await _sdk(sdk_settings, n)
    encoded = [(d["runId"].encode(), encode_avro(d)) for d in docs]
    global _avg_value_bytes
    _avg_value_bytes = sum(len(v) for _, v in encoded) / len(encoded)
    raw = await _raw(raw_settings, encoded)
    murmur = [partition_for(base, d["runId"], "ingest") for d in docs]
    batched = await _raw_batched(batched_settings, encoded, murmur)
    return sdk, raw, batched


def _breakdown(n: int = 3000) -> dict[str, float]:
    """CPU µs per event of each SDK stage, measured without Kafka: where the gap to raw comes from."""
    from agentlog.schemas.validate import validate_doc, validate_minted
    from agentlog.streams.publisher import Run

    run = Run(None, "bench-run-0")  # type: ignore[arg-type]  # build() needs no publisher
    payloads = [_payload(i) for i in range(n)]
    out: dict[str, float] = {}
    t = time.process_time()
    docs = [run.build("variable.changed", p, sequence=i) for i, p in enumerate(payloads)]
    out["build (uuid7, timestamp, envelope)"] = (time.process_time() - t) / n * 1e6
    t = time.process_time()
    for d in docs:
        validate_doc(d)
    out["validate_doc (the full check, for comparison)"] = (time.process_time() - t) / n * 1e6
    t = time.process_time()
    payload_json = [validate_minted(d) for d in docs]
    out["validate_minted (what emit runs; canonicalises the payload)"] = (time.process_time() - t) / n * 1e6
    t = time.process_time()
    for d, pj in zip(docs, payload_json, strict=True):
        encode_avro(d, pj)
    out["encode_avro (payload bytes reused)"] = (time.process_time() - t) / n * 1e6
    return {k: round(v, 1) for k, v in out.items()}


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    rounds = 1 if ctx.quick else 3
    settings = ctx.settings.replace(partitions=4)
    asyncio.run(_round(settings, 2_000))  # warm-up: JIT-free, but connections, imports, broker page cache
    sdk, raw, batched, sdk_cpu, raw_cpu = [], [], [], [], []
    for _ in range(rounds):
        s, r, b = asyncio.run(_round(settings, n))
        sdk.append(n / s.wall)
        raw.append(n / r.wall)
        batched.append(n / b.wall)
        sdk_cpu.append(s.cpu / n * 1e6)
        raw_cpu.append(r.cpu / n * 1e6)
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
            # The SDK hands aiokafka whole batches; the same bytes through that API, for the record:
            "raw_batch_api_rounds": batched,
            "ratio_to_raw_batch_api": statistics.median(sdk) / statistics.median(batched),
            # CPU µs per event in this process (client side only; the broker is another process)
            "sdk_cpu_us_per_event": statistics.median(sdk_cpu),
            "raw_cpu_us_per_event": statistics.median(raw_cpu),
            "avg_value_bytes": round(_avg_value_bytes),
            "sdk_stage_cpu_us_per_event": _breakdown(),
        },
    }
