"""Handoff processor, derive mode: join a dispatch with its child run's outcome.

A parent run's ``node.dispatched`` and the child run's terminal ``run.*`` event
live in two runs, so (keyed by runId) usually on two partitions. Both are
re-keyed by childRunId onto the ``handoff-links`` topic, where one partition
sees both, whichever comes first; the pure
:func:`processors.handoff_machine.derive_child_outcome` then yields the
``child.*`` / ``output.harvested`` transitions. Check mode needs none of this:
the fold checks host-emitted transitions inside the parent run.
"""

from __future__ import annotations

import logging

log = logging.getLogger("agentlog.handoff")


def join(record: dict | None, message: dict) -> tuple[dict, list[dict]]:
    """Fold one handoff-links message into the child's join record; pure.

    Returns the new record and the derived transitions (empty until both sides are known).
    """
    from processors.handoff_machine import derive_child_outcome

    rec = dict(record or {"link": None, "terminal": None, "done": False})
    if message.get("kind") == "link":
        rec["link"] = message["link"]
    elif message.get("kind") == "child-terminal":
        rec["terminal"] = message["event"]
    if rec["done"] or rec["link"] is None or rec["terminal"] is None:
        return rec, []
    rec["done"] = True
    transitions = [
        {k: v for k, v in t.items() if k != "kind"}
        for t in derive_child_outcome(rec["link"], rec["terminal"])
    ]
    return rec, transitions


def _child_of(message: dict) -> str:
    """The childRunId a handoff-links message is about (its Kafka key, read from the value)."""
    if message.get("kind") == "link":
        return message["link"]["childRunId"]
    return message["event"]["runId"]


def install(wiring) -> None:
    from processors.app import Batch, in_order, ordered_agent
    from processors.metrics import METRICS
    from streams.codec import decode_record, encode_record

    @ordered_agent(wiring, "handoff-links", name="handoff", table="links")
    async def handoff(stream):
        async for events in stream.take_events(wiring.settings.batch_max, within=wiring.settings.batch_within_s):
            batch = Batch(wiring, "handoff", len(events))
            for event in events:
                msg = event.message

                async def handle(offset: int, _ts: int, value: bytes, _p=msg.partition, _b=batch) -> None:
                    try:
                        message = decode_record(value)
                        child = _child_of(message)
                        new, transitions = join(_b.get("links", child), message)
                    except Exception:
                        log.exception("bad handoff-links record %s/%s", _p, offset)
                        return
                    for t in transitions:
                        await _b.send("transitions", t["parentRunId"], encode_record(t))
                        METRICS.inc("agentlog_handoff_transitions_total", phase=t.get("phase", "?"), derived="true")
                    _b.set("links", _p, child, new)

                await in_order(batch, "links", msg, event.value, handle)
            await batch.commit()
