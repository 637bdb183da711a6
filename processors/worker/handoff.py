"""The handoff agent, derive mode: join a dispatch with its child run's outcome.

A parent run's ``node.dispatched`` and the child run's terminal ``run.*`` event
live in two runs, so (keyed by runId) usually on two partitions. Both are
re-keyed by childRunId onto the ``handoff-links`` topic, where one partition
sees both, whichever comes first; the pure :func:`agentlog.core.handoff.join`
then yields the ``child.*`` / ``output.harvested`` transitions. Check mode needs
none of this: the fold checks host-emitted transitions inside the parent run.
"""

from __future__ import annotations

import logging

from agentlog.core.handoff import child_of, join
from agentlog.metrics import METRICS
from agentlog.streams.codec import decode_record, encode_record
from agentlog.worker.ports import SourceRecord
from agentlog.worker.sequencer import Staging
from agentlog.worker.txruntime import TxAgents

log = logging.getLogger("agentlog.handoff")


def install(agents: TxAgents) -> None:
    """Register the handoff agent on ``handoff-links`` and its table ``links``.

    It runs on the worker's transactions (:mod:`agentlog.worker.txruntime`): it reads ``handoff-links`` committed
    only, so a link of a sequencer batch that never committed is never joined, and a batch's transitions, its
    ``links`` writes and its next offset are committed together.
    """

    async def handle(batch: Staging, record: SourceRecord) -> None:
        try:
            message = decode_record(record.value)
            child = child_of(message)
            new, transitions = join(batch.get("links", child), message)
        except Exception:
            log.exception("bad handoff-links record %s/%s", record.partition, record.offset)
            return
        for t in transitions:
            await batch.send("transitions", t["parentRunId"], encode_record(t))
            METRICS.inc("agentlog_handoff_transitions_total", phase=t.get("phase", "?"), derived="true")
        batch.set("links", record.partition, child, new)

    agents.table("links")
    agents.agent("handoff-links", name="handoff", table="links", handle=handle)
