"""Run state around the one-pass sequencer: host-replay verdicts, the live log check.

The fold itself happens in the sequencer's pass (:mod:`agentlog.worker.sequencer`); what
is left here keeps no table, so none of it runs on the agents' transactions:

* :class:`Verdicts` computes the verdict of every host replay that reached a terminal status,
  in a task of its own once the batch is durable: a verdict waits for the replay's child runs
  (up to 10 s), and the ingest agent's next batch does not wait with it;
* :func:`install_log_check` re-checks every record of the committed log with a plain
  aiokafka consumer (its own group), so a record appended or rewritten behind the
  sequencer's back is flagged as ``hash_chain_broken`` where it lands, not only when
  someone thinks to replay. A record at an offset the broker acknowledged to this process's
  sequencer is its own (:class:`agentlog.worker.wiring.OwnLogRecords`) and is not re-hashed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from agentlog.core.runstate import chain_problem
from agentlog.metrics import METRICS
from agentlog.replay.host import host_replay_verdict, stored_verdict
from agentlog.streams.codec import decode_record, encode_record
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from agentlog.worker.wiring import Wiring

log = logging.getLogger("agentlog.runstate")

#: Records the log check re-hashes between two yields to the event loop (~20 ms of work).
CHECK_YIELD_EVERY = 100


class Verdicts:
    """Host-replay verdicts, one after the other in an app task, off the ingest agent's path.

    :meth:`ask` queues the request of a replay run whose terminal event is durable. A worker that
    stops before the verdict is sent loses it, as it would lose one computed inside the batch's
    after-commit hook: ``agentlog replay`` computes it again on demand.
    """

    def __init__(self, wiring: Wiring) -> None:
        self._wiring = wiring
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def host_replay_verdicts() -> None:
            await self._serve()

        wiring.runner.task(host_replay_verdicts)

    def ask(self, request: dict[str, Any]) -> None:
        self._queue.put_nowait(request)

    async def _serve(self) -> None:
        while True:
            request = await self._queue.get()
            try:
                record = await host_replay_verdict(self._wiring.settings, request, ended=True)
                if request.get("mode") != "dry_run":
                    keyring = self._wiring.keyring
                    key = keyring.data_key(request["replayRunId"]) if keyring is not None else None
                    stored = stored_verdict(record, key)  # its content sealed like the replay run's
                    await (await self._wiring.send("verdicts", request["replayRunId"], encode_record(stored)))
            except asyncio.CancelledError:
                raise
            except Exception:  # one replay's verdict failing never stops the next one's
                log.exception("host-replay verdict of %s failed", request.get("replayRunId"))


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

    async def log_check() -> None:
        while True:
            try:
                await _check_log(wiring)
            except asyncio.CancelledError:
                raise
            except Exception:  # the broker went away, …: start over from the group's committed offsets
                log.exception("log check stopped; restarting in 5 s")
                await asyncio.sleep(5)

    wiring.runner.task(log_check)


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
            ours = wiring.own_log.ours
            checked = 0
            for messages in batches.values():
                for m in messages:
                    if ours(m.partition, m.offset):
                        continue  # the sequencer's own record: a valid chain link
                    checked += 1
                    if checked % CHECK_YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # a backlog of records to re-hash does not hold the agents up
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
