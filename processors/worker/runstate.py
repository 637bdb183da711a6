"""The run-state agent: committed log → fold → transitions, violations, digests, snapshots.

The step itself is pure (:func:`processors.core.runstate.step`); this agent feeds
it from the log, sends what it returns, and once a batch is durable asks for the
verdict of every host replay that reached a terminal status in it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

from processors.core.runstate import TERMINAL_TYPES, step
from processors.metrics import METRICS
from processors.replay.host import host_replay_verdict
from processors.worker.batch import Batch, SourceRecord, batched_agent
from processors.worker.wiring import Wiring
from schemas.records import CommittedEvent
from streams.codec import decode_record, encode_record

log = logging.getLogger("agentlog.runstate")


def install(wiring: Wiring, *, replay: bool = True) -> None:
    """Register the run-state agent; ``replay=False`` leaves host-replay comparison out."""
    settings = wiring.settings

    async def handle(batch: Batch, record: SourceRecord) -> None:
        try:
            committed = cast(CommittedEvent, decode_record(record.value))
            run_id = committed["doc"]["runId"]
            new, sends = step(batch.get("runs", run_id), committed, partition=record.partition,
                              offset=record.offset, snapshot_every=settings.snapshot_every,
                              handoff_mode=settings.handoff_mode)
        except Exception:  # never die on one record; the sequencer already validated it
            log.exception("cannot fold log record %s/%s", record.partition, record.offset)
            return
        if new is None:
            return
        for short, key, out in sends:
            await batch.send(short, key, encode_record(out))
            _count(short, out)
        batch.set("runs", record.partition, run_id, new)
        replay_of = (new["state"] or {}).get("replayOf")
        if replay and replay_of and committed["doc"]["type"] in TERMINAL_TYPES:
            batch.collected.append({"replayRunId": run_id, **replay_of})

    async def verdicts(batch: Batch) -> None:
        for request in batch.collected:
            record = await host_replay_verdict(settings, request)
            if request.get("mode") != "dry_run":
                await (await wiring.send("verdicts", request["replayRunId"], encode_record(record)))

    batched_agent(wiring, "log", name="runstate", table="runs", handle=handle, after_commit=verdicts)


def _count(short: str, value: Mapping[str, Any]) -> None:
    if short == "transitions":
        METRICS.inc("agentlog_handoff_transitions_total", phase=value.get("phase", "?"),
                    derived=str(bool(value.get("derived"))).lower())
    elif short == "violations":
        METRICS.inc("agentlog_violations_total", code=value.get("code", "?"))
    elif short == "snapshots":
        METRICS.inc("agentlog_snapshots_total")
