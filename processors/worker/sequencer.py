"""The sequencer agent: ingest → committed log | rejections.

The single writer of the committed log per partition (SPEC §4). The decision is
:func:`processors.core.sequencing.decide`; this agent only decodes, asks, and
sends what the decision says.
"""

from __future__ import annotations

import logging

from processors.core.sequencing import Accepted, Redelivered, Rejected, Source, decide, rejection_record
from processors.metrics import METRICS
from processors.worker.batch import Batch, SourceRecord, batched_agent
from processors.worker.wiring import Wiring
from schemas.errors import ContractError
from schemas.validate import validate_doc
from streams.codec import decode_ingest, encode_record

log = logging.getLogger("agentlog.sequencer")

#: Separates runId and eventId in the ``index`` table's keys.
INDEX_SEP = "\x1f"


def install(wiring: Wiring) -> None:
    """Register the sequencer agent."""
    max_bytes = wiring.settings.max_event_bytes

    async def handle(batch: Batch, record: SourceRecord) -> None:
        raw = record.value
        source = Source(record.topic, record.partition, record.offset, record.timestamp_ms)
        doc = None
        try:
            doc = decode_ingest(raw)
            validate_doc(doc, max_bytes=max_bytes)
        except ContractError as e:
            await _reject(batch, e.code, getattr(e, "detail", None) or str(e), raw, source, doc)
            return
        except Exception as e:  # a processor never dies on one bad record
            log.exception("unexpected error decoding %s", source)
            await _reject(batch, "decode_error", f"{type(e).__name__}: {e}", raw, source, None)
            return
        run_id = doc["runId"]

        def find(event_id: str) -> list | None:
            return batch.get("index", run_id + INDEX_SEP + event_id)

        try:
            decision = decide(batch.get("heads", run_id), find, doc, source)
        except Exception as e:
            log.exception("unexpected error sequencing %s", source)
            decision = Rejected("invalid_envelope", f"{type(e).__name__}: {e}")
        if isinstance(decision, Accepted):
            await batch.send("log", run_id, encode_record(decision.committed))
            batch.set("heads", source.partition, run_id, decision.head)
            event_id, entry = decision.index_entry
            batch.set("index", source.partition, run_id + INDEX_SEP + event_id, entry)
            METRICS.inc("agentlog_events_accepted_total")
        elif isinstance(decision, Redelivered):
            if decision.head is not None:
                batch.set("heads", source.partition, run_id, decision.head)
            METRICS.inc("agentlog_redelivered_total")
        else:
            await _reject(batch, decision.reason, decision.detail, raw, source, doc)
            if decision.reason == "duplicate_event_id":
                METRICS.inc("agentlog_duplicates_dropped_total")

    batched_agent(wiring, "ingest", name="sequencer", table="heads", handle=handle)


async def _reject(batch: Batch, reason: str, detail: str, raw: bytes, source: Source, doc: object) -> None:
    record = rejection_record(reason, detail, raw, source, doc if isinstance(doc, dict) else None)
    await batch.send("rejections", record["runId"], encode_record(record))
    METRICS.inc("agentlog_events_rejected_total", reason=reason)
