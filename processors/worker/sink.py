"""Audit sink: every output topic → ClickHouse, in column-oriented batches.

One agent per topic, each taking up to ``sink_batch_rows`` records or what
arrived within ``sink_flush_s``. Offsets are committed only after the insert
returned, so a crash redelivers the batch; the tables' natural keys
(ReplacingMergeTree) and the deduplicating reads make that invisible in query
results. A failing insert is retried with backoff and never skipped: losing an
audit row silently is the one thing this sink must not do.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from processors.audit.migrations import open_owned
from processors.audit.store import Store
from processors.metrics import METRICS
from processors.worker.batch import Batch, SourceRecord, batched_agent
from processors.worker.wiring import Wiring
from streams.codec import decode_record

log = logging.getLogger("agentlog.sink")

#: topic short name -> record kind understood by :meth:`processors.audit.store.Store.insert_records`
SINK_TOPICS = {
    "log": "committed",
    "transitions": "transition",
    "violations": "violation",
    "rejections": "rejection",
    "snapshots": "snapshot",
    "digests": "digest",
    "verdicts": "verdict",
    "checkpoints": "checkpoint",  # issue #18 signing
}


class BlockingSink:
    """Serialises inserts into one store from the event loop (chdb is in-process and blocking)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

    def insert(self, kind: str, records: list[dict[str, Any]]) -> None:
        with self._lock:
            self.store.insert_records(kind, records)


async def insert_with_retry(sink: BlockingSink, kind: str, records: list[dict[str, Any]], *, table: str) -> None:
    delay = 0.5
    loop = asyncio.get_running_loop()
    while True:
        try:
            await loop.run_in_executor(None, sink.insert, kind, records)
            return
        except Exception as e:
            METRICS.inc("agentlog_sink_errors_total", table=table)
            log.error("insert of %d %s rows failed (%s); retrying in %.1fs", len(records), kind, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


def install(wiring: Wiring) -> None:
    """Open (and migrate) the audit store and register one sink agent per output topic."""
    settings = wiring.settings
    wiring.store = open_owned(settings)
    sink = BlockingSink(wiring.store)
    for short, kind in SINK_TOPICS.items():
        _install_one(wiring, sink, short, kind)


def _install_one(wiring: Wiring, sink: BlockingSink, short: str, kind: str) -> None:
    settings = wiring.settings

    async def handle(batch: Batch, record: SourceRecord) -> None:
        try:
            value = decode_record(record.value)
        except Exception:
            log.exception("undecodable %s record %s/%s", short, record.partition, record.offset)
            return
        value["_position"] = {"partition": record.partition, "offset": record.offset}
        batch.collected.append((value, record.timestamp_ms))

    async def insert(batch: Batch) -> None:
        if not batch.collected:
            return
        records = [value for value, _ in batch.collected]
        await insert_with_retry(sink, kind, records, table=short)
        # positions (and skipped records read around the consumer) are committed after the insert
        METRICS.inc("agentlog_sink_batches_total", table=short)
        METRICS.inc("agentlog_sink_rows_total", len(records), table=short)
        oldest_ms = min((ts for _, ts in batch.collected if ts), default=None)
        if oldest_ms is not None:
            METRICS.set("agentlog_sink_lag_seconds", max(0.0, time.time() - oldest_ms / 1000), table=short)

    batched_agent(wiring, short, name=f"sink-{short}", table="sink-positions", handle=handle,
                  before_commit=insert, max_events=settings.sink_batch_rows, within_s=settings.sink_flush_s)
