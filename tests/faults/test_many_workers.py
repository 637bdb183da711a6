"""Three workers in one group on 8 partitions; a random one is SIGKILLed and restarted every few seconds.

Many workers: one ``--role all`` worker (the only process that may open the embedded
chdb directory: it runs the audit sink) and two ``--role process`` workers share the
agents' groups (``<prefix>-worker-<agent>``, and the log check's group) while events stream in. Every kill
moves partitions, their tables and their batches in flight to the survivors; killing the ``all``
worker also restarts the sink, whose flock on the chdb directory the kernel releases at the kill.

Afterwards, against oracles computed here from the published docs alone:

* the committed log holds every event exactly once per (runId, sequence), no conflicting copy,
  and its hash chain is the chain recomputed from the docs;
* ClickHouse, read WITHOUT FINAL: ``count()`` of events = events sent, one row per (runId, sequence);
* every run's final snapshot equals the clean offline fold, with the right head hash;
* nothing rejected, nothing flagged;
* no partition left uncommitted: lag 0 for every group (each agent's on the topic it reads,
  the log check's group on the log, the sink's group on every topic it stores).

Size: ``AGENTLOG_FAULT_EVENTS`` (default 20,000 here, so the test stays within ~4 minutes on the
2-core CI machine; the full 50,000 is ``AGENTLOG_FAULT_EVENTS=50000``);
``AGENTLOG_FAULT_KILL_EVERY_S`` the mean seconds between kills (default 3); ``AGENTLOG_FAULT_KILLS`` the
fewest kills (default 8: they go on while the group drains if the stream ended first); ``AGENTLOG_FAULT_SEED``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter

import pytest

from agentlog.audit.exactly_once import ledger_gaps
from agentlog.audit.sink import SINK_TOPICS
from agentlog.audit.store import open_store
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_topic
from tests.faults.gen import chain_of, mixed_stream
from tests.faults.kafka_util import Offsets
from tests.faults.readback import check_runs, read_outputs, sealed_runs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(1200)]

EVENTS = int(os.environ.get("AGENTLOG_FAULT_EVENTS", 20_000))
KILL_EVERY_S = float(os.environ.get("AGENTLOG_FAULT_KILL_EVERY_S", 3.0))
#: Kills go on after the stream ends (while the group drains) until at least this many were made.
MIN_KILLS = int(os.environ.get("AGENTLOG_FAULT_KILLS", 8))
PARTITIONS = 8
PER_RUN = 100
FAMILIES = 3
CHUNK = 1000
#: Everything the agents' groups (``<prefix>-worker-<agent>``) consume: ingest, handoff links, OTel spans and events.
AGENT_TOPICS = ("ingest", "handoff-links", "spans", "otel-events")


async def _lags(offsets: Offsets) -> dict[str, int]:
    prefix = offsets.settings.topic_prefix
    return {
        "worker": await offsets.lag(AGENT_TOPICS),
        "logcheck": await offsets.lag(("log",), group=f"{prefix}-worker-logcheck"),
        "audit-sink": await offsets.lag(tuple(SINK_TOPICS), group=f"{prefix}.audit-sink"),
    }


def test_three_workers_one_group_random_sigkills(settings, ledger):
    rng = random.Random(int(os.environ.get("AGENTLOG_FAULT_SEED", "18")))
    settings = settings.replace(partitions=PARTITIONS, session_timeout_s=6.0, otlp_port=0)
    snapshots = {"agentlog.worker.sequencer:SNAPSHOT_EVERY": 25}
    asyncio.run(ensure_topics(settings))
    runs, stream = mixed_stream(rng, events=EVENTS, families=FAMILIES, per_run=PER_RUN, name="many")
    total = len(stream)
    workers = [WorkerProcess(settings, role="all", log_name="many-all", constants=snapshots),
               WorkerProcess(settings, role="process", log_name="many-process-1", constants=snapshots),
               WorkerProcess(settings, role="process", log_name="many-process-2", constants=snapshots)]
    for w in workers:
        w.start()
    t0 = time.monotonic()
    kills: list[str] = []
    published = asyncio.Event()

    async def publish(offsets: Offsets) -> None:
        """Publish in chunks, keeping a few chunks ahead of the log so kills hit a live stream."""
        async with Publisher(settings, wire="avro") as pub:
            for start in range(0, total, CHUNK):
                for doc in stream[start:start + CHUNK]:
                    await pub.send_doc(doc)
                await pub.flush()

                async def caught_up(limit=start - 3 * CHUNK):
                    return await offsets.log_end() >= limit

                await wait_until(caught_up, timeout=600, interval=0.3, what="log to follow the publisher")
        published.set()

    async def kill_loop() -> None:
        """Every few seconds (random), SIGKILL a random worker and start it again at once."""
        while not published.is_set() or len(kills) < MIN_KILLS:
            pause = rng.uniform(0.5, 1.5) * KILL_EVERY_S
            if published.is_set():
                await asyncio.sleep(pause)
            else:
                try:
                    await asyncio.wait_for(published.wait(), timeout=pause)
                    continue  # the stream ended: stop here unless too few kills were made
                except TimeoutError:
                    pass
            victim = rng.choice(workers)
            kills.append(victim.role)
            victim.kill()
            victim.start()

    async def scenario() -> dict[str, int]:
        async with Offsets(settings) as offsets:
            await asyncio.gather(publish(offsets), kill_loop())

            async def drained():
                for w in workers:
                    if not w.alive():
                        raise AssertionError(f"{w.log_path.name} died:\n{w.log_tail()}")
                rejected = sum((await offsets.ends(("rejections",))).values())
                if rejected:  # nothing in this stream is bad: a rejection is an event lost to a crash
                    reasons = Counter([r["reason"] async for _, _, _, r in read_topic(settings, "rejections")])
                    raise AssertionError(f"{rejected} events rejected after kills (lost): {dict(reasons)}")
                if await offsets.log_end() < total:
                    return False
                lags = await _lags(offsets)
                return lags if not any(lags.values()) else False

            return await wait_until(drained, timeout=300 + total / 100, interval=1.0, what="every group drained")

    try:
        final_lags = asyncio.run(scenario())
        drained_after = time.monotonic() - t0
    finally:
        for w in workers:
            w.stop()
    assert sum(w.starts for w in workers) == len(kills) + 3

    out = asyncio.run(read_outputs(settings))
    lost = check_runs(runs, out)
    copies, conflicts = out.copies, out.conflicts

    # --- ClickHouse: the workers are stopped, so this process may own the chdb directory now ------------
    with open_store(settings) as store:
        events = store.query("SELECT count() FROM events").rows[0][0]  # no FINAL
        dup_rows = store.query(
            "SELECT run_id, sequence, count() AS c FROM events GROUP BY run_id, sequence HAVING c > 1 LIMIT 5"
        ).rows
        hashes = dict(((r, s), h) for r, s, h in store.query("SELECT run_id, sequence, hash FROM events").rows)
        gaps = ledger_gaps(store)
        rollup_events = store.query("SELECT sum(events) FROM run_rollup").rows[0][0]
    assert gaps == [], gaps
    assert dup_rows == []
    assert events == len(hashes) == total
    assert rollup_events == total
    for run_id, docs in sealed_runs(runs, out.keyring).items():
        for doc, (_, h) in zip(docs, chain_of(docs), strict=True):
            assert hashes[(run_id, doc["sequence"])] == h
    ledger.record(
        "many_workers", sent=total, accepted=total, lost=lost, duplicated=conflicts + len(dup_rows),
        workers="1 all + 2 process", partitions=PARTITIONS, runs=len(runs), kills=len(kills),
        kills_by_role=dict(Counter(kills)), log_redelivered_copies=copies, clickhouse_events_without_final=events,
        final_group_lag=final_lags, seconds_to_drain=round(drained_after, 1),
    )
