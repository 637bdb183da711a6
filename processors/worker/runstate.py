"""Run state around the one-pass sequencer: host-replay verdicts, the live log check.

The fold itself happens in the sequencer's pass (:mod:`processors.worker.sequencer`); what
is left here needs no Faust table, so none of it consumes through a Faust stream:

* :func:`send_verdicts` asks for the verdict of every host replay that reached a terminal
  status once its batch is durable;
* :func:`install_log_check` re-checks every record of the committed log with a plain
  aiokafka consumer (its own group), so a record appended or rewritten behind the
  sequencer's back is flagged as ``hash_chain_broken`` where it lands, not only when
  someone thinks to replay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from processors.core.runstate import chain_problem
from processors.metrics import METRICS
from processors.replay.host import host_replay_verdict
from processors.worker.wiring import Wiring
from streams.codec import decode_record, encode_record
from streams.security import client_kwargs
from streams.topics import topic_name

log = logging.getLogger("agentlog.runstate")


async def send_verdicts(wiring: Wiring, requests: list[dict[str, Any]]) -> None:
    """The host-replay verdict of each replay run that reached a terminal status (after its batch is durable)."""
    for request in requests:
        record = await host_replay_verdict(wiring.settings, request)
        if request.get("mode") != "dry_run":
            await (await wiring.send("verdicts", request["replayRunId"], encode_record(record)))


def count(short: str, value: Mapping[str, Any]) -> None:
    """Count one fold output into the worker's metrics."""
    if short == "transitions":
        METRICS.inc("agentlog_handoff_transitions_total", phase=value.get("phase", "?"),
                    derived=str(bool(value.get("derived"))).lower())
    elif short == "violations":
        METRICS.inc("agentlog_violations_total", code=value.get("code", "?"))
    elif short == "snapshots":
        METRICS.inc("agentlog_snapshots_total")


def install_log_check(wiring: Wiring) -> None:
    """Run the live log check as an app task (a plain consumer: it keeps no table)."""

    @wiring.app.task  # type: ignore[untyped-decorator]  # faust's App.task is @no_type_check
    async def log_check() -> None:
        while True:
            try:
                await _check_log(wiring)
            except asyncio.CancelledError:
                raise
            except Exception:  # the broker went away, …: start over from the group's committed offsets
                log.exception("log check stopped; restarting in 5 s")
                await asyncio.sleep(5)


async def _check_log(wiring: Wiring) -> None:
    """Consume the log in bulk; send a violation for each record that is not a valid chain link, then commit.

    At least once: the offsets are committed only after the batch's violations are acknowledged,
    so a crash repeats a violation rather than losing it (violations are keyed and deduplicated by
    readers like every other output).
    """
    settings = wiring.settings
    consumer = AIOKafkaConsumer(
        topic_name(settings, "log"),
        **client_kwargs(settings),
        group_id=f"{settings.topic_prefix}-worker-logcheck",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        client_id="agentlog-logcheck",
    )
    await consumer.start()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if not batches:
                continue
            futures = []
            written = wiring.written
            for messages in batches.values():
                for m in messages:
                    if written.pop((m.partition, m.offset), None) == m.value:
                        continue  # the sequencer's own record, byte for byte: a valid chain link
                    try:
                        problem = chain_problem(decode_record(m.value))
                    except Exception as e:  # not a record the sequencer wrote either; nothing to key it by
                        log.error("log record %d/%d does not decode: %s", m.partition, m.offset, e)
                        METRICS.inc("agentlog_log_undecodable_total")
                        continue
                    if problem is not None:
                        futures.append(await wiring.send("violations", problem["runId"], encode_record(problem)))
                        count("violations", problem)
            for fut in futures:
                await fut
            try:
                await consumer.commit()
            except KafkaError as e:  # a rebalance: the next owner re-checks from the last commit
                log.warning("log check commit failed: %s", e)
    finally:
        await consumer.stop()
