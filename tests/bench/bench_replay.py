"""Replay-verify throughput: ``agentlog.replay.rederive.replay_run`` from an offset vs a raw aiokafka read.

Setup (not timed): one run of N events is published through the SDK and a real ``agentlog
worker`` process builds its committed log (each record carries its stateHash) and
snapshots; the worker is stopped before measuring. Ours: re-derive the run from the log
offset of its middle event — load the nearest snapshot, re-read the log from there, refold,
check the hash chain and compare the state hash each record carries at every index; the
whole call is timed (one consumer: the snapshots read and one read of the log from the
snapshot's own record on). Baseline: the same records (same partition, from the same offset to
the end) read with a plain aiokafka consumer with the same settings (no group, assign +
seek, read_committed, the reader's fetch wait) and only decoded with the same strict JSON decoder. Rate = events
verified (or read) per second of wall time. The details also give each side's CPU time per event
(``time.process_time``) and their ratio, which moves far less than wall time when other jobs
share the cores.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentlog.replay.rederive import replay_run
from agentlog.schemas.errors import InfraError
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import decode_record
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import READER_FETCH_MAX_WAIT_MS, read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, settings_env
from agentlog.streams.topics import topic_name
from agentlog.worker.sequencer import SNAPSHOT_EVERY
from tests.bench import BenchContext, own

REPO = Path(__file__).resolve().parents[2]
VARIABLES = 20  # distinct variable names: the state stays the size of a real run's, not of N


def _event(i: int) -> tuple[str, dict]:
    """A realistic mix: mostly variable updates, some usage records and channel writes."""
    if i % 100 == 0:
        return "channel.written", {"channel": "progress", "value": {"step": i, "note": "checkpoint"}}
    if i % 10 == 0:
        return "provider.usage", {"provider": "anthropic", "model": "claude-x", "inputTokens": 800 + i % 97,
                                  "outputTokens": 90 + i % 13}
    return "variable.changed", {"name": f"var{i % VARIABLES}", "value": {"step": i, "score": i % 1000,
                                                                         "note": "observation " * 4}}


async def _publish(settings: Settings, run_id: str, n: int) -> None:
    async with Publisher(settings, wire="avro") as pub:
        run = pub.run(run_id)
        await run.emit("run.started", {"bindings": {"engineVersion": "1.4.0"}}, node_id="start")
        for i in range(1, n - 1):
            type_, payload = _event(i)
            await run.emit(type_, payload, node_id=f"node{i % 5}")
        await run.emit("run.completed", {"status": "completed"}, node_id="end")


async def _terminal_snapshot(settings: Settings, run_id: str, last: int) -> bool:
    async for _, _, _, value in read_topic(settings, "snapshots", key=run_id):
        if value.get("runId") == run_id and value.get("atSequence") == last:
            return True
    return False


def _worker(settings: Settings) -> subprocess.Popen:
    settings.home.mkdir(parents=True, exist_ok=True)
    log = open(settings.home / "bench-replay-worker.log", "a")  # noqa: SIM115 - owned by the child
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "agentlog", "worker", "--loglevel", "warning",
                             "--role", "process", "--no-web"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


async def _build(settings: Settings, run_id: str, n: int, timeout_s: float) -> None:
    await ensure_topics(settings)
    proc = _worker(settings)
    try:
        await _publish(settings, run_id, n)
        deadline = time.monotonic() + timeout_s
        while not await _terminal_snapshot(settings, run_id, n - 1):
            if proc.poll() is not None:
                raise InfraError(f"the worker exited ({proc.returncode}); see {settings.home}/bench-replay-worker.log")
            if time.monotonic() > deadline:
                raise InfraError(f"the worker did not fold {n} events within {timeout_s:.0f}s")
            await asyncio.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


async def _middle_offset(settings: Settings, run_id: str, seq: int) -> tuple[int, int]:
    """Where sequence ``seq`` of the run sits in the log (read from the log itself)."""
    async for partition, offset, _, value in read_topic(settings, "log", key=run_id):
        doc = value.get("doc") or {}
        if doc.get("runId") == run_id and doc.get("sequence") == seq:
            return partition, offset
    raise InfraError(f"no log record for sequence {seq} of {run_id}")


async def _raw(settings: Settings, partition: int, start: int) -> tuple[float, int, float]:
    consumer = AIOKafkaConsumer(**client_kwargs(settings), group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed",
                                client_id="agentlog-reader", fetch_max_wait_ms=READER_FETCH_MAX_WAIT_MS)
    t0, c0 = time.perf_counter(), time.process_time()
    await consumer.start()
    try:
        tp = TopicPartition(topic_name(settings, "log"), partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        end = (await consumer.end_offsets([tp]))[tp]
        count = 0
        while await consumer.position(tp) < end:
            for messages in (await consumer.getmany(tp, timeout_ms=500)).values():
                for m in messages:
                    decode_record(m.value)
                    count += 1
    finally:
        await consumer.stop()
    return count / (time.perf_counter() - t0), count, (time.process_time() - c0) / max(count, 1)


async def _ours(settings: Settings, run_id: str, offset: int) -> tuple[float, dict, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    result = await replay_run(settings, run_id, from_offset=offset)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if result.verdict != "match":
        raise InfraError(f"bench replay did not match: {result.first_divergence}")
    events = result.compared
    return events / elapsed, result.to_json_dict(), cpu / max(events, 1)


def run(ctx: BenchContext) -> dict:
    n = 2_000 if ctx.quick else 20_000
    rounds = 1 if ctx.quick else 3
    tag = uuid.uuid4().hex[:8]
    settings = ctx.settings.replace(topic_prefix=own(f"bench-{tag}-replay"), partitions=4,
                                    home=ctx.settings.home / f"bench-replay-{tag}")
    run_id = f"bench-replay-{tag}"
    t0 = time.perf_counter()
    asyncio.run(_build(settings, run_id, n, timeout_s=max(300.0, n / 20)))
    build_s = time.perf_counter() - t0
    partition, middle = asyncio.run(_middle_offset(settings, run_id, n // 2))
    ours, raw, result = [], [], {}
    ours_cpu, raw_cpu = [], []  # CPU seconds per event: steadier than wall time on a shared machine
    for _ in range(rounds):
        rate, result, cpu = asyncio.run(_ours(settings, run_id, middle))
        ours.append(rate)
        ours_cpu.append(cpu)
        # The baseline reads what the replay read: from where the replay started reading.
        raw_rate, _, cpu = asyncio.run(_raw(settings, partition, result["readFromOffset"]))
        raw.append(raw_rate)
        raw_cpu.append(cpu)
    return {
        "ours": statistics.median(ours),
        "baseline": statistics.median(raw),
        "unit": "events/s",
        "goal_ratio": 0.5,
        "details": {
            "events": n,
            "rounds": rounds,
            "from_sequence": result.get("fromSeq"),
            "snapshot_used": result.get("snapshotUsed"),
            "verified_per_round": result.get("compared"),
            "snapshot_every": SNAPSHOT_EVERY,
            "worker_build_s": round(build_s, 1),
            "ours_rounds": ours,
            "raw_rounds": raw,
            "ours_cpu_us_per_event": [round(c * 1e6, 2) for c in ours_cpu],
            "raw_cpu_us_per_event": [round(c * 1e6, 2) for c in raw_cpu],
            "cpu_ratio": round(statistics.median(raw_cpu) / statistics.median(ours_cpu), 3),
        },
    }
