"""Faust's own ceiling (bench baseline): an agent that only forwards each ingest record to the log topic.

Faust's public API only: at-least-once (or its own exactly-once), acks=all, 1 MiB producer batches, an agent taking
``take_events`` batches of up to 5,000 records within 0.2 s and forwarding them with raw ``producer.send``,
concurrency 1, with no work at all: what Faust itself reaches, for the worker to be measured against.
Run as ``python -m tests.bench.passthrough_faust worker`` with the ``AGENTLOG_*`` environment.
"""

from __future__ import annotations

import os

import faust

from agentlog.streams.settings import load_settings
from agentlog.streams.topics import topic_name
from agentlog.worker.app import faust_broker_kwargs

settings = load_settings()
(settings.home / "passthrough-faust").mkdir(parents=True, exist_ok=True)
app = faust.App(
    f"{settings.topic_prefix}-passthrough",
    **faust_broker_kwargs(settings),
    store="memory://",
    # PASSTHROUGH_GUARANTEE=exactly_once: Faust's own transactions (bench_runtime's faust_eos path)
    processing_guarantee=os.environ.get("PASSTHROUGH_GUARANTEE", "at_least_once"),
    autodiscover=False,
    web_enabled=False,
    topic_partitions=settings.partitions,
    topic_replication_factor=settings.replication_factor,
    consumer_auto_offset_reset="earliest",
    producer_acks=-1,
    producer_max_batch_size=1 << 20,
    producer_linger=0.005,
    stream_wait_empty=False,
    datadir=str(settings.home / "passthrough-faust"),
)

ingest = app.topic(topic_name(settings, "ingest"), key_type=bytes, value_type=bytes,
                   key_serializer="raw", value_serializer="raw")
LOG = topic_name(settings, "log")


@app.agent(ingest, concurrency=1)
async def forward(stream):
    async for events in stream.take_events(5000, within=0.2):
        futures = [await app.producer.send(LOG, e.message.key, e.value, None, None, None) for e in events]
        for fut in futures:
            await fut


if __name__ == "__main__":
    app.main()
