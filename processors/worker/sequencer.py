"""The sequencer agent: ingest → committed log | rejections.

The single writer of the committed log per partition (SPEC §4). What to do with a
record is :func:`processors.core.sequencing.sequence` (decode, validate, decide);
this agent only asks and sends what the decision says.
"""

from __future__ import annotations

import logging

from processors.core.sequencing import Accepted, IndexLookup, Redelivered, Source, rejection_record, sequence
from processors.metrics import METRICS
from processors.worker.batch import Batch, SourceRecord, batched_agent
from processors.worker.wiring import Wiring
from streams.codec import encode_record

log = logging.getLogger("agentlog.sequencer")

#: Separates runId and eventId in the ``index`` table's keys.
INDEX_SEP = "\x1f"


def install(wiring: Wiring) -> None:
    """Register the sequencer agent."""
    max_bytes = wiring.settings.max_event_bytes

    async def handle(batch: Batch, record: SourceRecord) -> None:
        source = Source(record.topic, record.partition, record.offset, record.timestamp_ms)

        def lookup_of(run_id: str) -> IndexLookup:
            return lambda event_id: batch.get("index", run_id + INDEX_SEP + event_id)

        decoded = sequence(record.value, lambda run_id: batch.get("heads", run_id), lookup_of, source,
                           max_bytes=max_bytes)
        decision, doc = decoded.decision, decoded.doc
        if decoded.unexpected is not None:
            log.error("unexpected error on %s", source, exc_info=decoded.unexpected)
        if isinstance(decision, Accepted):
            run_id = decision.committed["doc"]["runId"]
            await batch.send("log", run_id, encode_record(decision.committed))
            batch.set("heads", source.partition, run_id, decision.head)
            event_id, entry = decision.index_entry
            batch.set("index", source.partition, run_id + INDEX_SEP + event_id, entry)
            METRICS.inc("agentlog_events_accepted_total")
        elif isinstance(decision, Redelivered):
            if decision.head is not None:
                assert doc is not None  # a redelivery was decoded
                batch.set("heads", source.partition, doc["runId"], decision.head)
            METRICS.inc("agentlog_redelivered_total")
        else:
            rec = rejection_record(decision.reason, decision.detail, record.value, source, doc)
            await batch.send("rejections", rec["runId"], encode_record(rec))
            METRICS.inc("agentlog_events_rejected_total", reason=decision.reason)
            if decision.reason == "duplicate_event_id":
                METRICS.inc("agentlog_duplicates_dropped_total")

    batched_agent(wiring, "ingest", name="sequencer", table="heads", handle=handle)
