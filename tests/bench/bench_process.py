"""Processing throughput: the agentlog worker against Faust's own ceiling and a bare consume → produce.

The figure is on the realistic workload (:mod:`tests.bench.workload`: multi-agent runs with LLM
calls, tools, usage, handoffs, child runs, every run finishing, 1,000 trees in flight): ours against
the Faust pass-through on the same events. The toy workload (200 runs that only set variables) is
kept beside it, with the bare path.

Every path consumes the same N pre-published events (own topic prefix each, same
partitions, same broker) and writes one record per event to its ``log`` topic
(acks=all). Throughput = N / (last log record's broker timestamp − first one's), so
process start-up and group join are not counted for anyone.

- ``ours``: ``agentlog worker --role process`` (the one-pass sequencer: decode, validate,
  decide, fold, state hash, the committed record with its stateHash, tables).
- ``passthrough``: a Faust agent that forwards each record with no work
  (:mod:`tests.bench.passthrough_faust`): Faust's own ceiling, the yardstick of the goal.
- ``bare``: one aiokafka consumer + idempotent producer in this process copying the bytes.

How much of the gap to ``bare`` is the per-event work itself: ``bench_runtime`` (``work_ceiling``).

Latency: a second worker (and then a pass-through agent: the floor) on a fresh prefix is fed at a steady rate (``LATENCY_RATE`` ev/s)
once every partition has been warmed by a run.started and the same load has run for
``LATENCY_WARM_SECONDS`` (neither measured: steady state is what is measured, see there); publish →
committed log latency is each paced record's log broker timestamp minus its source record's
timestamp (one clock: this machine). Beside it, each process's CPU over the measured seconds: what a steady rate
costs an event, against the same events on a backlog.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agentlog.streams.admin import ensure_topics, topic_partitions
from agentlog.streams.codec import decode_ingest, decode_record
from agentlog.streams.publisher import Publisher
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings, settings_env
from agentlog.streams.topics import topic_name
from tests.bench import PASSTHROUGH_ARGS, BenchContext, own, workload

RUNS = 200
REPO = Path(__file__).resolve().parents[2]



async def emit_paced(pub: Any, runs: list[Any], total: int, rate: float, *, name: str = "v") -> None:
    """Emit ``total`` small events round-robin over ``runs`` at ``rate`` per second, flushing every 10.

    Each sets variable ``{name}{i % 13}`` (``name`` tells a warm-up's events from the measured ones).
    """
    t0 = time.monotonic()
    for i in range(total):
        await runs[i % len(runs)].emit("variable.changed", {"name": f"{name}{i % 13}", "value": i})
        if i % 10 == 9:
            await pub.flush()
            ahead = t0 + (i + 1) / rate - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
    await pub.flush()

async def _publish(settings: Settings, n: int) -> None:
    async with Publisher(settings, wire="avro") as pub:
        runs = [pub.run(f"proc-run-{r}") for r in range(RUNS)]
        await runs[0].emit("run.started", {"bindings": {"engineVersion": "bench"}})
        for r in runs[1:]:
            await r.emit("run.started", {"bindings": {"engineVersion": "bench"}})
        for i in range(n - RUNS):
            run = runs[i % RUNS]
            await run.emit("variable.changed", {"name": f"v{i % 13}", "value": i})
        await pub.flush()


async def topic_stamps(settings: Settings, short: str, n: int, *, timeout: float, procs: list | None = None,
                       wanted: Callable[[str], bool] | None = None,
                       isolation_level: str = "read_uncommitted") -> list[int]:
    """Broker timestamps (sorted) of the first ``n`` records on a topic, or of those whose key ``wanted``; waits for n.

    ``isolation_level="read_committed"`` counts only records of committed transactions (a transactional writer).

    Raises RuntimeError when a process in ``procs`` exits or ``timeout`` passes first.
    """
    topic = topic_name(settings, short)
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level=isolation_level)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic]))[topic]]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        stamps: list[int] = []
        deadline = time.monotonic() + timeout
        while len(stamps) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(stamps)}/{n} records on {topic} after {timeout}s")
            for proc in procs or ():
                if proc.poll() is not None:
                    raise RuntimeError(f"a process under test exited with {proc.returncode}; see its log")
            for messages in (await consumer.getmany(timeout_ms=500, max_records=20000)).values():
                stamps.extend(m.timestamp for m in messages
                              if wanted is None or (m.key is not None and wanted(m.key.decode())))
        return sorted(stamps)[:n]
    finally:
        await consumer.stop()


async def _span(settings: Settings, short: str, n: int, timeout: float, proc=None) -> float:
    """Seconds between the first and the n-th record (broker timestamps) on a topic; waits for n."""
    stamps = await topic_stamps(settings, short, n, timeout=timeout, procs=[proc] if proc is not None else None)
    return max(1e-3, (stamps[n - 1] - stamps[0]) / 1000.0)


def _start(settings: Settings, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1", **(env or {})}  # logs readable as it runs
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


class CpuSampler:
    """A process's CPU time (user + system, every thread; ``/proc/<pid>/stat``), sampled every 50 ms in a thread.

    CPU per event is less noisy than wall time on a shared machine, and CPU per wall second says
    whether the process was CPU-bound (near 1) or waiting.
    """

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._done.is_set():
            try:
                fields = Path(f"/proc/{self._pid}/stat").read_text().rsplit(")", 1)[1].split()
                self.samples.append((time.time(), (int(fields[11]) + int(fields[12])) / tick))
            except (OSError, IndexError, ValueError):
                pass
            self._done.wait(0.05)

    def between(self, first: float, last: float, n: int) -> dict[str, float]:
        """``cpu_us_per_event`` and ``cpu_per_wall`` for ``n`` events between two wall-clock times (epoch s)."""
        if not self.samples:
            return {}

        def at(ts: float) -> float:
            return min(self.samples, key=lambda s: abs(s[0] - ts))[1]

        used = at(last) - at(first)
        return {"cpu_us_per_event": used / n * 1e6, "cpu_per_wall": used / max(1e-3, last - first)}


def _run_subprocess(settings: Settings, args: list[str], n: int, log: Path, short: str = "log",
                    cpu: dict | None = None, env: dict[str, str] | None = None,
                    isolation_level: str = "read_uncommitted") -> float:
    """Seconds the process ``args`` (with ``env`` added) took for the n records (broker stamps); ``cpu`` gets its CPU
    per event.

    The CPU spent between the first and the n-th record is reported as µs per event (:class:`CpuSampler`).
    """
    proc = _start(settings, args, log, env)
    try:
        with CpuSampler(proc.pid) as sampler:
            stamps = asyncio.run(topic_stamps(settings, short, n, timeout=600, procs=[proc],
                                              isolation_level=isolation_level))
    finally:
        _stop(proc)
    first, last = stamps[0] / 1000.0, stamps[n - 1] / 1000.0
    if cpu is not None:
        cpu.update(sampler.between(first, last, n))
    return max(1e-3, last - first)


async def from_the_start(consumer: AIOKafkaConsumer, settings: Settings) -> None:
    """Assign ``consumer`` every partition of the ingest topic, at its first record."""
    topic = topic_name(settings, "ingest")
    parts = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic]))[topic]]
    consumer.assign(parts)
    await consumer.seek_to_beginning(*parts)


def _producer(settings: Settings) -> AIOKafkaProducer:
    return AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True,
                            linger_ms=5, max_batch_size=1 << 20)


async def _bare(settings: Settings, n: int) -> float:
    """Consume → produce of the same bytes, no work: what the broker and client allow here."""
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed")
    producer = _producer(settings)
    await consumer.start()
    await producer.start()
    log_topic = topic_name(settings, "log")
    try:
        await from_the_start(consumer, settings)
        done = 0
        while done < n:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            futures = [await producer.send(log_topic, m.value, key=m.key)
                       for messages in batches.values() for m in messages]
            done += len(futures)
            for f in futures:
                await f
    finally:
        await producer.stop()
        await consumer.stop()
    return await _span(settings, "log", n, timeout=60)


#: Events per second fed to the worker for the latency measurement, and for how long.
LATENCY_RATE = 1000
LATENCY_SECONDS = 10
#: Seconds of the same paced load before the measured ones (not measured): steady state is what is
#: measured. On topics created for the run, the produce request that crosses a partition's first
#: ``index.interval.bytes`` (4 KiB), where the broker writes that segment's first index entry, takes
#: ~5-9 ms more per partition (a bare aiokafka producer on fresh topics: 17-47 ms for a request to 4
#: partitions against a median of ~1 ms, and never again over the next ~110 index entries; with
#: ``segment.index.bytes`` 64 KiB instead of 10 MiB it does not happen: the cost is the new segment's
#: index, once per segment). The worker's changelogs cross it in their first second; its low-volume
#: topics (checkpoints, snapshots: one round per ``snapshot_every`` events of a run, every 5 s here)
#: only in their second round: with 6 s of warm-up that round falls in the measured window (traced:
#: its two requests take 24 and 33 ms, the next rounds' 1-6 ms). 12 s takes
#: every run through two rounds, so no topic is fresh when measuring; a long-lived deployment pays
#: this once per segment (1 GiB, or 7 days). The warm-up's own percentiles are reported beside.
LATENCY_WARM_SECONDS = 12
WARM_NAME = "warm"


async def _paced_latency(settings: Settings, proc: subprocess.Popen, seconds: float, warm_seconds: float,
                         sampler: CpuSampler | None = None) -> dict:
    """Publish at LATENCY_RATE ev/s (after ``warm_seconds`` of the same, not measured); percentiles of publish → log,
    and the process's CPU over the measured seconds (``sampler``): what a steady rate costs, against a backlog."""
    async with Publisher(settings, wire="avro") as pub:
        warm = pub.run("lat-warm")
        await warm.emit("run.started", {"bindings": {"engineVersion": "bench"}})
        await pub.flush()
        await _span(settings, "log", 1, timeout=300, proc=proc)
        runs = [pub.run(f"lat-run-{r}") for r in range(50)]
        for r in runs:
            await r.emit("run.started", {"bindings": {"engineVersion": "bench"}})
        await pub.flush()
        # Every partition warm (50 runs cover the 4): a partition's first record makes the worker look
        # up where that partition starts (a consumer's start-up), once; steady state is what is measured.
        await _span(settings, "log", 1 + len(runs), timeout=300, proc=proc)
        warm_events = int(LATENCY_RATE * warm_seconds)
        await emit_paced(pub, runs, warm_events, LATENCY_RATE, name=WARM_NAME)
        total = int(LATENCY_RATE * seconds)
        began = time.time()
        await emit_paced(pub, runs, total, LATENCY_RATE)
        ended = time.time()
    expected = 1 + len(runs) + warm_events + total
    await _span(settings, "log", expected, timeout=300, proc=proc)
    # The pass-through forwards the ingest bytes as they are: its log record's source is the ingest
    # record with the same bytes.
    ingest = {value: ts async for _, _, ts, value in read_with_ts(settings, "ingest")}
    lat: list[int] = []
    cold: list[int] = []  # the warm-up's own events: what the first seconds on fresh topics look like
    async for _, _, ts, value in read_with_ts(settings, "log"):
        if value in ingest:
            doc, source_ts = decode_ingest(value), ingest[value]
        else:
            record = decode_record(value)
            doc, source_ts = record["doc"], record["source"]["timestampMs"]
        if doc["runId"] == "lat-warm" or doc["type"] == "run.started":
            continue
        (cold if str(doc["payload"].get("name", "")).startswith(WARM_NAME) else lat).append(ts - source_ts)
    cpu = sampler.between(began, ended, total) if sampler is not None else {}
    return {"rate_per_s": LATENCY_RATE, "warm_s": warm_seconds, **_percentiles(lat),
            "warm_phase": _percentiles(cold), "cpu": cpu}


def _percentiles(lat: list[int]) -> dict:
    lat = sorted(lat)
    if not lat:
        return {"events": 0}
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    return {"events": len(lat), "p50_ms": pick(0.5), "p95_ms": pick(0.95), "p99_ms": pick(0.99), "max_ms": lat[-1]}


async def read_with_ts(settings: Settings, short: str):
    """(partition, offset, timestamp, raw value) of a topic (``read_topic`` gives no timestamps)."""
    consumer = AIOKafkaConsumer(**client_kwargs(settings), enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        topic = topic_name(settings, short)
        parts = [TopicPartition(topic, p) for p in (await topic_partitions(settings, [topic]))[topic]]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        async def behind() -> bool:
            return any([await consumer.position(tp) < ends[tp] for tp in parts])

        while await behind():
            batches = await consumer.getmany(timeout_ms=500, max_records=20000)
            for tp, messages in batches.items():
                for m in messages:
                    yield tp.partition, m.offset, m.timestamp, m.value
    finally:
        await consumer.stop()


def _latency(settings: Settings, args: list[str], seconds: float, log: Path,
             warm_seconds: float = LATENCY_WARM_SECONDS) -> dict:
    """Publish → log latency percentiles of the process ``args`` starts (the worker, or the pass-through)."""
    proc = _start(settings, args, log)
    try:
        with CpuSampler(proc.pid) as sampler:
            return asyncio.run(_paced_latency(settings, proc, seconds, warm_seconds, sampler))
    except Exception as e:  # the throughput figures stand on their own
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        _stop(proc)


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    base = ctx.settings
    home = REPO / ".agentlog" / "bench" / f"process-{uuid.uuid4().hex[:6]}"

    def variant(name: str, events: int = n, *, realistic: bool = False) -> Settings:
        s = base.replace(topic_prefix=own(f"bench{name}{uuid.uuid4().hex[:6]}"), home=home / name, partitions=4,
                         replication_factor=1, otlp_port=0)
        asyncio.run(ensure_topics(s))
        if events and realistic:
            asyncio.run(workload.publish(s, f"{name}-run", events, concurrent=1000))
        elif events:
            asyncio.run(_publish(s, events))
        return s

    worker = ["-m", "agentlog", "worker", "--role", "process", "--no-web"]
    real_pass_cpu: dict = {}
    real_cpu: dict = {}
    real_pass = n / _run_subprocess(variant("passreal", realistic=True), PASSTHROUGH_ARGS, n,
                                    home / "passthrough-realistic.log", cpu=real_pass_cpu)
    real = n / _run_subprocess(variant("oursreal", realistic=True), worker, n, home / "ours-realistic.log",
                               cpu=real_cpu)
    bare = n / asyncio.run(_bare(variant("bare"), n))
    pass_cpu: dict = {}
    ours_cpu: dict = {}
    passthrough = n / _run_subprocess(variant("pass"), PASSTHROUGH_ARGS, n, home / "passthrough.log", cpu=pass_cpu)
    ours = n / _run_subprocess(variant("ours"), worker, n, home / "ours.log", cpu=ours_cpu)
    seconds = LATENCY_SECONDS / (5 if ctx.quick else 1)
    warm = LATENCY_WARM_SECONDS / (5 if ctx.quick else 1)
    latency = _latency(variant("lat", 0), worker, seconds, home / "latency.log", warm)
    passthrough_latency = _latency(variant("passlat", 0), PASSTHROUGH_ARGS, seconds, home / "passthrough-latency.log",
                                   warm)
    return {
        "ours": real,
        "baseline": real_pass,
        "unit": "events/s (realistic runs)",
        "goal_ratio": 0.8,
        "details": {"events": n, "realistic_ours_cpu": real_cpu, "realistic_passthrough_cpu": real_pass_cpu,
                    "toy_runs": RUNS, "toy_ours_events_per_s": ours, "toy_passthrough_events_per_s": passthrough,
                    "toy_ratio": ours / passthrough, "bare_consume_produce_events_per_s": bare,
                    "faust_passthrough_events_per_s": passthrough,
                    "ours_vs_bare": ours / bare, "passthrough_vs_bare": passthrough / bare,
                    "floor_ratio": 0.5,
                    "ours_cpu": ours_cpu, "passthrough_cpu": pass_cpu,
                    "publish_to_log_latency_ms": latency, "latency_goal_p99_ms": 50,
                    "passthrough_publish_to_log_latency_ms": passthrough_latency},
    }
