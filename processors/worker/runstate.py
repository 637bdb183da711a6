"""Run state around the one-pass sequencer: catching a run up, host-replay verdicts, the live log check.

The fold itself happens in the sequencer's pass (:mod:`processors.worker.sequencer`); what
is left here needs no Faust table, so none of it consumes through a Faust stream:

* :func:`catch_up` folds a run whose ``runs`` record is behind the event being committed,
  from the run's own log records — a worker started on tables of the two-hop version
  (whose run-state agent lagged the log), or a run whose fold failed once;
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

from processors.core.runstate import RunRecord, advance, chain_problem
from processors.metrics import METRICS
from processors.replay.host import host_replay_verdict
from processors.worker.batch import Batch
from processors.worker.wiring import Wiring
from streams.codec import decode_record, encode_record
from streams.reader import ReadProgress, read_run
from streams.security import client_kwargs
from streams.settings import Settings
from streams.topics import topic_name

log = logging.getLogger("agentlog.runstate")

#: Runs whose catch-up failed in this process: not retried for every later event.
_HOPELESS: set[str] = set()


async def catch_up(wiring: Wiring, batch: Batch, run_id: str, rec: RunRecord | None, seq: int) -> RunRecord | None:
    """``rec`` folded forward over the run's committed records up to (not including) ``seq``.

    Reads the run's log partition (a full read: this is the upgrade and repair path, not the
    hot one). Returns None when the log does not hold every sequence in between; the event is
    then committed without a state hash (a format-1 record, which readers check against the
    ``digests`` topic, if any) and the error is logged.

    The read runs inside the sequencer's batch, so it is bounded: each attempt may take
    ``catch_up_timeout_s``, and one that does not finish is abandoned (its consumer closed) and
    tried again with a fresh one, ``catch_up_attempts`` times in all; the log line says which
    step stalled (:class:`streams.reader.ReadProgress`).
    """
    if run_id in _HOPELESS:
        return None
    settings = wiring.settings
    start = rec["next"] if rec else 0
    log.warning("run %s: run state is at sequence %d, the log at %d; folding the gap from the log", run_id,
                start, seq)
    try:
        records = await _read_bounded(settings, run_id)
        for committed in records:
            doc = committed["doc"]
            s = doc.get("sequence")
            if type(s) is not int or s < start or s >= seq:
                continue
            if s != (rec["next"] if rec else 0):
                raise ValueError(f"the log skips from sequence {(rec['next'] if rec else 0) - 1} to {s}")
            rec = advance(rec, doc, committed["hash"], snapshot_every=settings.snapshot_every,
                          handoff_mode=settings.handoff_mode).record
        if (rec["next"] if rec else 0) != seq:
            raise ValueError(f"the log ends before sequence {seq}")
    except Exception:
        log.exception("run %s: cannot catch the run state up to sequence %d; its records carry no state hash",
                      run_id, seq)
        _HOPELESS.add(run_id)
        return None
    METRICS.inc("agentlog_runs_caught_up_total")
    return rec


async def _read_bounded(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    """``read_run`` of the run's log, each attempt bounded by ``catch_up_timeout_s``.

    Raises:
        TimeoutError: every attempt stalled; the message says where the last one was.
    """
    attempts = max(1, settings.catch_up_attempts)
    for attempt in range(1, attempts + 1):
        progress = ReadProgress()
        try:
            return await asyncio.wait_for(read_run(settings, run_id, progress=progress),
                                          timeout=settings.catch_up_timeout_s)
        except TimeoutError:
            METRICS.inc("agentlog_catch_up_read_timeouts_total")
            where = f"the read of run {run_id}'s log stalled for {settings.catch_up_timeout_s:g} s at {progress}"
            if attempt == attempts:
                raise TimeoutError(f"{where}; gave up after {attempts} attempts") from None
            log.warning("%s; reading again with a fresh consumer (attempt %d of %d)", where, attempt + 1, attempts)
    raise AssertionError("unreachable")  # pragma: no cover


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
