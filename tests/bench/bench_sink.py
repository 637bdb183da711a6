"""Audit sink end to end: committed log topic → ClickHouse (chdb), vs a direct chdb insert.

``ours`` runs the real sink (:class:`agentlog.audit.sink.AuditSink`: consumer group,
range ledger, natural-key check, insert with its deduplication token, rollup views) over
N CommittedEvent records already on a real ``log`` topic, timed from the moment its first fetch
arrives (``AuditSink.first_fetch_at``) until ``SELECT count() FROM events`` = N. The consumer-group
join before it (seconds, a constant per start) is reported apart as ``details.join_s``: inside the
figure it would dominate a baseline that takes ~1 s for 200k rows. ``baseline`` inserts the very
same rows, already mapped to columns, with one raw ``client.insert`` per batch into
``events_raw`` (same columns, no views): what ClickHouse itself costs. Goal:
ours ≥ 0.5× baseline, measured in the same run.

``python -m tests.bench.bench_sink [--events N]`` runs it alone (broker from
``AGENTLOG_KAFKA_BOOTSTRAP``); the harness calls ``run(ctx)``. The sink stores two partitions'
batches at once (``agentlog.audit.sink.LANES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid

from aiokafka import AIOKafkaProducer

from agentlog.audit import sink as audit_sink
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import encode_record
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.bench import BenchContext, own

RUNS = 100

#: The baseline's rows per ``client.insert``: 20,000, whatever the sink's ``BATCH_ROWS`` is, so the baseline
#: stays comparable across runs (30,000-row direct inserts are no faster).
BASELINE_BATCH = 20_000


def _committed(n: int) -> list[dict]:
    from agentlog.core.runstate import advance

    heads = [GENESIS] * RUNS
    seqs = [0] * RUNS
    states: list = [None] * RUNS
    out = []
    for i in range(n):
        r = i % RUNS
        run_id = f"sink-run-{r}"
        doc = {"eventId": f"{run_id}-{seqs[r]}", "runId": run_id, "type": "variable.changed",
               "payload": {"name": f"v{i % 11}", "value": i}, "timestamp": "2026-01-01T00:00:00.000Z",
               "sequence": seqs[r], "nodeId": "n1"}
        h = chain_hash(heads[r], doc)
        folded = advance(states[r], doc, h, snapshot_every=10**9, handoff_mode="auto")
        out.append({"doc": doc, "prevHash": heads[r], "hash": h, "stateHash": folded.state_hash,
                    "source": {"topic": "bench.ingest", "partition": 0, "offset": i, "timestampMs": 0}})
        heads[r], seqs[r], states[r] = h, seqs[r] + 1, folded.record
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


def run(ctx: BenchContext) -> dict:
    from agentlog.audit.migrations import migrate
    from agentlog.audit.rows import rows_for
    from agentlog.audit.store import open_store

    n = _N or (20_000 if ctx.quick else 200_000)
    settings = ctx.settings.replace(topic_prefix=own(f"benchsink{uuid.uuid4().hex[:6]}"), partitions=4, replication_factor=1)
    asyncio.run(ensure_topics(settings))
    records = _committed(n)
    asyncio.run(_produce(settings, records))
    batch = BASELINE_BATCH

    with tempfile.TemporaryDirectory(prefix="agentlog-bench-sink-") as tmp:
        store = open_store(f"chdb://{tmp}/ch")
        migrate(store)

        async def ours() -> float:
            from agentlog.audit.sink import AuditSink
            from agentlog.metrics import METRICS

            sink = AuditSink(settings, store, topics={"log": "committed"})
            t0 = time.perf_counter()
            task = asyncio.ensure_future(sink.run())
            try:
                # Progress is read from the sink's own counter (bumped once a batch's insert returned),
                # not by querying the store: a poll would take the store's client lock from the sink
                # and block the event loop the consumer runs in. The count is checked once at the end.
                rows0 = METRICS.get("agentlog_sink_rows_total", table="log")
                while METRICS.get("agentlog_sink_rows_total", table="log") - rows0 < n:
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.005)
                t1 = time.perf_counter()
                while store.query("SELECT count() FROM events").rows[0][0] < n:  # rows counted twice?
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.05)
                    t1 = time.perf_counter()
                first = sink.first_fetch_at or t0
                timings["join_s"] = round(first - t0, 3)
                return n / (t1 - first)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        timings: dict[str, float] = {}
        ours_rate = asyncio.run(ours())
        # Baseline: the same rows, already mapped, straight into a table of the same shape.
        store.command("CREATE TABLE events_raw AS events")
        columns_and_rows = [rows_for("committed", records[i:i + batch]) for i in range(0, n, batch)]
        t0 = time.perf_counter()
        for _table, cols, columns in columns_and_rows:
            store.client.insert("events_raw", columns, column_names=list(cols), column_oriented=True)
        raw_rate = n / (time.perf_counter() - t0)
        stored = store.query("SELECT count() FROM events").rows[0][0]
        store.close()
    return {
        "ours": ours_rate,
        "baseline": raw_rate,
        "unit": "rows/s",
        "goal_ratio": 0.5,
        "details": {"rows": n, "batch": audit_sink.BATCH_ROWS, "baseline_batch": batch, "rows_in_clickhouse": stored, **timings},
    }


def main(argv: list[str] | None = None) -> dict:
    import argparse

    from agentlog.streams.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m tests.bench.bench_sink", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args(argv)
    global _N
    _N = args.events
    result = run(BenchContext(settings=load_settings()))
    print({k: (round(v) if isinstance(v, float) and k != "goal_ratio" else v) for k, v in result.items()},
          f"ratio {result['ours'] / result['baseline']:.2f}")
    return result


_N: int | None = None

if __name__ == "__main__":
    main()
