"""A naive Faust agent doing the worker's per-event work, one event at a time (bench baseline).

What a first Faust version would look like: ``async for event in stream``, the
table written per event, outputs sent per event. Same pure functions as the
worker, so the difference measured is the processing shape, not the logic.
Run as ``python -m tests.bench.naive_faust worker`` with the ``AGENTLOG_*`` environment.
"""

from __future__ import annotations

import faust

from processors.core.fold import fold, state_hash
from processors.core.sequencing import Accepted, Source, decide
from schemas.validate import validate_doc
from streams.codec import decode_ingest, encode_record
from streams.settings import load_settings
from streams.topics import topic_name

settings = load_settings()
(settings.home / "naive-faust").mkdir(parents=True, exist_ok=True)
app = faust.App(
    f"{settings.topic_prefix}-naive",
    broker=f"kafka://{settings.kafka_bootstrap}",
    store="memory://",
    autodiscover=False,
    web_enabled=False,
    topic_partitions=settings.partitions,
    topic_replication_factor=settings.replication_factor,
    consumer_auto_offset_reset="earliest",
    key_serializer="json",
    value_serializer="json",
    datadir=str(settings.home / "naive-faust"),
)


def _topic(short: str):
    return app.topic(topic_name(settings, short), key_type=bytes, value_type=bytes,
                     key_serializer="raw", value_serializer="raw")


ingest, log_topic, digests = _topic("ingest"), _topic("log"), _topic("digests")
heads = app.Table("naive-heads", default=None, partitions=settings.partitions)
index = app.Table("naive-index", default=None, partitions=settings.partitions)
states = app.Table("naive-states", default=None, partitions=settings.partitions)


@app.agent(ingest)
async def process(stream):
    async for event in stream.events():
        msg = event.message
        doc = validate_doc(decode_ingest(event.value))
        run_id = doc["runId"]
        d = decide(heads.get(run_id), lambda e: index.get(run_id + "\x1f" + e), doc,  # noqa: B023 - called at once
                   Source(msg.topic, msg.partition, msg.offset, int(msg.timestamp * 1000)))
        if not isinstance(d, Accepted):
            continue
        state, _ = fold(states.get(run_id), doc)
        key = run_id.encode()
        await log_topic.send(key=key, value=encode_record(d.committed))
        await digests.send(key=key, value=encode_record({
            "runId": run_id, "sequence": doc["sequence"], "stateHash": state_hash(state), "headHash": d.head["hash"]}))
        heads[run_id] = d.head
        index[run_id + "\x1f" + d.index_entry[0]] = d.index_entry[1]
        states[run_id] = state


if __name__ == "__main__":
    app.main()
