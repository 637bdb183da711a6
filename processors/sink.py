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

log = logging.getLogger("agentlog.sink")

# topic short name -> record kind understood by processors.store / audit_rows
SINK_TOPICS = {
    "log": "committed",
    "transitions": "transition",
    "violations": "violation",
    "rejections": "rejection",
    "snapshots": "snapshot",
    "digests": "digest",
    "verdicts": "verdict",
}


class BlockingSink:
    """Serialises inserts into one store from the event loop (chdb is in-process and blocking)."""

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()

    def insert(self, kind: str, records: list[dict]) -> None:
        with self._lock:
            self.store.insert_records(kind, records)


async def insert_with_retry(sink: BlockingSink, kind: str, records: list[dict], *, table: str) -> None:
    from processors.metrics import METRICS

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


def _open_owned(settings, migrate, open_store, *, wait_s: float = 60.0):
    """Open (and migrate) the store, waiting out a short-lived opener such as a CLI query.

    chdb lets one process own a directory; a user's ``agentlog query`` run while
    no worker owned it holds the lock for a moment. A worker that died on that
    would be absurd, so it retries; a long-lived owner still ends in one clear error.
    """
    from schemas.errors import StoreError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            migrate(settings)
            return open_store(settings)
        except StoreError as e:
            if e.code not in {"store_locked", "store_unavailable", "store_busy"} or time.monotonic() > deadline:
                raise
            log.warning("audit store busy (%s); retrying", e)
            time.sleep(1.0)


def install(wiring) -> None:
    from processors.app import Batch, in_order, ordered_agent
    from processors.metrics import METRICS
    from processors.store import migrate, open_store
    from streams.codec import decode_record

    settings = wiring.settings
    wiring.store = _open_owned(settings, migrate, open_store)
    sink = BlockingSink(wiring.store)

    def make_agent(short: str, kind: str) -> None:
        async def agent(stream):
            async for events in stream.take_events(settings.sink_batch_rows, within=settings.sink_flush_s):
                batch = Batch(wiring, f"sink-{short}", len(events))
                records = []
                oldest = None
                for event in events:
                    msg = event.message

                    async def handle(offset: int, _ts: int, value: bytes, _p=msg.partition) -> None:
                        try:
                            record = decode_record(value)
                        except Exception:
                            log.exception("undecodable %s record %s/%s", short, _p, offset)
                            return
                        record["_position"] = {"partition": _p, "offset": offset}
                        records.append(record)

                    await in_order(batch, "sink-positions", msg, event.value, handle)
                    if msg.timestamp and (oldest is None or msg.timestamp < oldest):
                        oldest = msg.timestamp
                if not records:
                    await batch.commit()
                    continue
                await insert_with_retry(sink, kind, records, table=short)
                await batch.commit()  # positions (and skipped records read around the consumer) after the insert
                METRICS.inc("agentlog_sink_batches_total", table=short)
                METRICS.inc("agentlog_sink_rows_total", len(records), table=short)
                if oldest is not None:
                    METRICS.set("agentlog_sink_lag_seconds", max(0.0, time.time() - oldest), table=short)

        agent.__name__ = f"sink_{short.replace('-', '_')}"
        ordered_agent(wiring, short, name=f"sink-{short}", table="sink-positions")(agent)

    for short, kind in SINK_TOPICS.items():
        make_agent(short, kind)
