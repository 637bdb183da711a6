"""Audit sink end to end: committed log topic → ClickHouse (chdb), vs a direct chdb insert.

``ours`` reads N CommittedEvent records from a real ``log`` topic with aiokafka,
decodes them and inserts them in sink-sized batches through
``Store.insert_records`` — the sink agent's own per-batch code path (the Faust
``take_events`` loop around it is left out so the figure is the data path, not
group start-up). ``baseline`` inserts the very same rows, already mapped to
columns, with one raw ``client.insert`` per batch into another chdb table: what
ClickHouse itself costs. Issue goal: ≥ 200k rows/s through the sink.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid

from aiokafka import AIOKafkaProducer

from schemas.canonical import GENESIS, chain_hash
from streams.admin import ensure_topics
from streams.codec import encode_record
from streams.security import client_kwargs
from streams.settings import Settings
from streams.topics import topic_name
from tests.bench import BenchContext

RUNS = 100


def _committed(n: int) -> list[dict]:
    heads = [GENESIS] * RUNS
    seqs = [0] * RUNS
    out = []
    for i in range(n):
        r = i % RUNS
        run_id = f"sink-run-{r}"
        doc = {"eventId": f"{run_id}-{seqs[r]}", "runId": run_id, "type": "variable.changed",
               "payload": {"name": f"v{i % 11}", "value": i}, "timestamp": "2026-01-01T00:00:00.000Z",
               "sequence": seqs[r], "nodeId": "n1"}
        h = chain_hash(heads[r], doc)
        out.append({"doc": doc, "prevHash": heads[r], "hash": h,
                    "source": {"topic": "bench.ingest", "partition": 0, "offset": i, "timestampMs": 0}})
        heads[r], seqs[r] = h, seqs[r] + 1
    return out


async def _produce(settings: Settings, records: list[dict]) -> None:
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True,
                                linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    try:
        topic = topic_name(settings, "log")
        futures = [await producer.send(topic, encode_record(r), key=r["doc"]["runId"].encode()) for r in records]
        for f in futures:
            await f
    finally:
        await producer.stop()


async def _read_batches(settings: Settings, batch: int):
    from streams.reader import read_topic

    buf = []
    async for partition, offset, _, value in read_topic(settings, "log"):
        value["_position"] = {"partition": partition, "offset": offset}
        buf.append(value)
        if len(buf) >= batch:
            yield buf
            buf = []
    if buf:
        yield buf


def run(ctx: BenchContext) -> dict:
    from processors.audit.migrations import migrate
    from processors.audit.rows import rows_for
    from processors.audit.store import open_store

    n = 20_000 if ctx.quick else 200_000
    settings = ctx.settings.replace(topic_prefix=f"benchsink{uuid.uuid4().hex[:6]}", partitions=4, replication_factor=1)
    asyncio.run(ensure_topics(settings))
    records = _committed(n)
    asyncio.run(_produce(settings, records))
    batch = settings.sink_batch_rows

    with tempfile.TemporaryDirectory(prefix="agentlog-bench-sink-") as tmp:
        store = open_store(f"chdb://{tmp}/ch")
        migrate(store)

        async def ours() -> float:
            t0 = time.perf_counter()
            count = 0
            async for chunk in _read_batches(settings, batch):
                count += store.insert_records("committed", chunk)
            assert count == n, count
            return n / (time.perf_counter() - t0)

        ours_rate = asyncio.run(ours())
        # Baseline: the same rows, already mapped, straight into a table of the same shape.
        store.command("CREATE TABLE events_raw AS events")
        columns_and_rows = [rows_for("committed", records[i:i + batch]) for i in range(0, n, batch)]
        t0 = time.perf_counter()
        for _table, cols, columns in columns_and_rows:
            store.client.insert("events_raw", columns, column_names=list(cols), column_oriented=True)
        raw_rate = n / (time.perf_counter() - t0)
        distinct = store.query("SELECT count() FROM events FINAL").rows[0][0]
        store.close()
    return {
        "ours": ours_rate,
        "baseline": raw_rate,
        "unit": "rows/s",
        "goal_ratio": 0.5,
        "details": {"rows": n, "batch": batch, "distinct_rows_in_clickhouse": distinct,
                    "goal_rows_per_s": 200_000},
    }
