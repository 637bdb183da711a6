"""Ingest → queryable: ``agentlog worker --role all`` (sequencer + audit sink into chdb) against bare aiokafka.

Throughput: N events of the realistic workload (:mod:`tests.bench.workload`: multi-agent runs
that finish) are published first, then the worker is started on that backlog, as the pass-through
is on its own (the publisher's CPU is in neither figure); the clock runs from the first event's
record in the committed log (broker timestamp) until ``SELECT count() FROM events`` covers them,
asked through the worker's own query endpoint every ``POLL_S``. The store is open before the
first record is sequenced (an ``all`` worker opens it as it starts; the split deployment's
``process`` worker is started once the ``sink`` worker answers queries). Baseline: bare aiokafka consume →
produce of the same N events in the same run (``bench_process._bare``); goal ≥ 0.3×. Beside it, Faust's own
pass-through agent (:mod:`tests.bench.passthrough_faust`) on them.

Every deployment of :data:`DEPLOYMENTS` is measured in the same run: the single ``--role all``
process (the claim), ``split``, a ``--role process`` worker beside a ``--role sink`` worker
(two processes, so the sink's ClickHouse work does not share the sequencer's core), and
``sinkprocess``, the same two processes started as one ``--role all --sink-process`` worker.

Latency: a second worker (of the same deployment) is fed at ``LATENCY_RATE`` ev/s; every ``POLL_S`` the
bench asks the store for the highest ingest offset per partition that is queryable (the
sink writes a partition's log in offset order, so everything up to it is). An event's
publish → queryable latency is the first poll that covers its ingest offset minus its
ingest record's timestamp; the poll interval bounds the error. Goal: p99 ≤ 2 s. Beside it,
``publish_to_log_ms``: the same events' publish → committed log (the log record's broker
timestamp), so the part the sink adds is the difference.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import orjson

from agentlog.audit.server import query_via_worker
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher
from agentlog.streams.settings import Settings
from tests.bench import PASSTHROUGH_ARGS, BenchContext, own, workload
from tests.bench.bench_process import (
    REPO,
    _bare,
    _run_subprocess,
    _start,
    _stop,
    emit_paced,
    read_with_ts,
    topic_stamps,
)
from tests.tools import free_port

POLL_S = 0.1
LATENCY_RATE = 1000
LATENCY_SECONDS = 10


async def log_stamps(settings: Settings, wanted: Callable[[str], bool], n: int, *, procs: list | None = None,
                     timeout: float = 600) -> list[int]:
    """Broker timestamps (sorted) of the first ``n`` log records whose key (runId) is ``wanted``; waits for them."""
    return await topic_stamps(settings, "log", n, timeout=timeout, procs=procs, wanted=wanted)


def _sql(settings: Settings, url: str, sql: str) -> list[list]:
    answer = query_via_worker(settings, {"sql": sql}, worker_url=url, timeout_s=30)
    if answer is None or "rows" not in answer:
        raise RuntimeError(f"the worker's query endpoint answered {answer!r}")
    return list(answer["rows"])


async def _until_count(settings: Settings, url: str, n: int, procs: list, timeout: float = 600) -> float:
    """Wall time (s) at which ``SELECT count() FROM events`` first answers ``n``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {proc.returncode}; see its log")
        try:
            rows = await asyncio.to_thread(_sql, settings, url, "SELECT count() FROM events")
            if int(rows[0][0]) >= n:
                return time.time()
        except Exception:  # noqa: BLE001 - not serving yet
            pass
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"events did not reach {n} rows in {timeout}s")


#: How the sequencer and the audit sink are deployed: one ``--role all`` process, (``split``) a
#: ``--role process`` worker beside a ``--role sink`` worker, the layout for more than one core
#: (README "Running the worker"; the sink worker owns the embedded store and answers the queries), or
#: (``sinkprocess``) one ``--role all --sink-process`` worker, which is that split behind one command
#: (the sink in the process started, the agents in its supervised child: :mod:`agentlog.worker.halves`).
DEPLOYMENTS = ("all", "split", "sinkprocess")


def _workers(settings: Settings, log_name: str, deployment: str = "all") -> tuple[Settings, list, str]:
    port = free_port()
    s = settings.replace(web_port=port, clickhouse_url=f"chdb://{settings.home / 'ch'}")
    web = ["--web", "--web-port", str(port)]
    if deployment in ("all", "sinkprocess"):
        half = ["--sink-process"] if deployment == "sinkprocess" else []
        procs = [_start(s, ["-m", "agentlog", "worker", "--role", "all", *half, *web], settings.home / log_name)]
    else:
        procs = [_start(s, ["-m", "agentlog", "worker", "--role", "sink", *web], settings.home / f"sink-{log_name}")]
        asyncio.run(_until_count(s, f"http://127.0.0.1:{port}", 0, procs))  # the store is open
        procs.append(_start(s.replace(home=settings.home / "process"),
                            ["-m", "agentlog", "worker", "--role", "process", "--no-web"],
                            settings.home / f"process-{log_name}"))
    return s, procs, f"http://127.0.0.1:{port}"


def _stop_all(procs: list) -> None:
    for proc in procs:
        _stop(proc)


async def _queryable_span(settings: Settings, url: str, procs: list, n: int) -> float:
    done_at = await _until_count(settings, url, n, procs)
    first = (await log_stamps(settings, lambda run: run.startswith("q-"), 1, procs=procs))[0]
    return max(1e-3, done_at - first / 1000.0)


def queryable_throughput(settings: Settings, n: int, deployment: str = "all") -> float:
    """N / (first log record → ``count()`` covers them), on a backlog published before the worker starts."""
    asyncio.run(workload.publish(settings, "q", n, concurrent=1000))
    s, procs, url = _workers(settings, "queryable.log", deployment)
    try:
        return n / asyncio.run(_queryable_span(s, url, procs, n))
    finally:
        _stop_all(procs)


def queryable_latency(settings: Settings, seconds: float, deployment: str = "all") -> dict:
    """Publish → queryable percentiles at :data:`LATENCY_RATE` ev/s (an error is reported, not raised)."""
    s, procs, url = _workers(settings, "latency.log", deployment)
    try:
        return asyncio.run(_paced_queryable(s, url, procs, seconds))
    except Exception as e:  # the throughput figures stand on their own
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        _stop_all(procs)


async def _paced_queryable(settings: Settings, url: str, procs: list, seconds: float) -> dict:
    async with Publisher(settings, wire="avro") as pub:
        runs = [pub.run(f"qlat-{r}") for r in range(50)]
        for r in runs:
            await r.emit("run.started", {"bindings": {"engineVersion": "bench"}})
        await pub.flush()
        await _until_count(settings, url, len(runs), procs)  # warm: every partition went through once
        polls: list[tuple[float, dict[int, int]]] = []

        async def poll(stop: asyncio.Event) -> None:
            sql = "SELECT kafka_partition, max(kafka_offset) FROM events GROUP BY kafka_partition"
            while not stop.is_set():
                rows = await asyncio.to_thread(_sql, settings, url, sql)
                polls.append((time.time(), {int(p): int(o) for p, o in rows}))
                await asyncio.sleep(POLL_S)

        stop = asyncio.Event()
        poller = asyncio.ensure_future(poll(stop))
        total = int(LATENCY_RATE * seconds)
        await emit_paced(pub, runs, total, LATENCY_RATE)
        await _until_count(settings, url, len(runs) + total, procs)
        stop.set()
        await poller
    ingest = await _stamps(settings, "ingest", _ingest_key)
    logged = await _stamps(settings, "log", _log_key)
    lat, to_log = [], []
    for (partition, offset), stamp in ingest.items():
        seen = next((t for t, tops in polls if tops.get(partition, -1) >= offset), None)
        if seen is not None:
            lat.append(seen * 1000 - stamp)
        if (partition, offset) in logged:
            to_log.append(logged[(partition, offset)] - stamp)
    # The split of the latency: publish → committed log (the sequencer; broker timestamps on both
    # sides) and what is left, log → queryable (the sink).
    return {"rate_per_s": LATENCY_RATE, "events": len(lat), "poll_s": POLL_S, **_percentiles(lat),
            "publish_to_log_ms": _percentiles(to_log)}


def _percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {}
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50_ms": pick(0.5), "p95_ms": pick(0.95), "p99_ms": pick(0.99), "max_ms": values[-1]}


def _ingest_key(partition: int, offset: int, value: bytes) -> tuple[int, int] | None:
    """A paced ingest record by its own position (the run.started warm-ups left out)."""
    return (partition, offset) if b"variable.changed" in value else None


def _log_key(partition: int, offset: int, value: bytes) -> tuple[int, int] | None:
    """A committed record by the ingest position it came from (``source``)."""
    source = orjson.loads(value).get("source") or {}
    return (int(source["partition"]), int(source["offset"])) if "offset" in source else None


async def _stamps(settings: Settings, short: str,
                  key_of: Callable[[int, int, bytes], tuple[int, int] | None]) -> dict[tuple[int, int], int]:
    """``key_of(record)`` → broker timestamp, for every record of topic ``short`` it keys."""
    out: dict[tuple[int, int], int] = {}
    async for partition, offset, stamp, value in read_with_ts(settings, short):
        key = key_of(partition, offset, value)
        if key is not None:
            out[key] = stamp
    return out


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    home = REPO / ".agentlog" / "bench" / f"queryable-{uuid.uuid4().hex[:6]}"

    def variant(name: str) -> Settings:
        s = ctx.settings.replace(topic_prefix=own(f"benchq{name}{uuid.uuid4().hex[:6]}"), home=home / name, partitions=4,
                                 replication_factor=1, otlp_port=0)
        asyncio.run(ensure_topics(s))
        return s

    passing = variant("pass")
    asyncio.run(workload.publish(passing, "pass", n, concurrent=1000))
    passthrough = n / _run_subprocess(passing, PASSTHROUGH_ARGS, n, home / "passthrough.log")
    bare_settings = variant("bare")
    asyncio.run(workload.publish(bare_settings, "bare", n, concurrent=1000))
    bare = n / asyncio.run(_bare(bare_settings, n))
    seconds = LATENCY_SECONDS / (3 if ctx.quick else 1)
    figures = {d: {"events_per_s": queryable_throughput(variant(d), n, d),
                   "publish_to_queryable_latency_ms": queryable_latency(variant(f"{d}lat"), seconds, d)}
               for d in DEPLOYMENTS}
    for f in figures.values():
        f["ratio_to_bare"] = f["events_per_s"] / bare
        f["ratio_to_passthrough"] = f["events_per_s"] / passthrough
    return {
        # The claim is the single ``all`` process; the split deployment is the second figure.
        "ours": figures["all"]["events_per_s"],
        "baseline": bare,
        "unit": "events/s",
        "goal_ratio": 0.3,
        "details": {"events": n, "bare_events_per_s": bare, "faust_passthrough_events_per_s": passthrough,
                    "deployments": figures, "latency_goal_p99_ms": 2000},
    }
