"""Lose one of three brokers while a host publishes with the SDK (acks=all, idempotent).

A private three-node KRaft cluster (its own home and ports), topics with replication 3 and
min.insync.replicas 2, a worker on it. A node is stopped in the middle of publishing and
started again later. Every event whose flush succeeded — directly, or after the SDK's own
``resend`` of what a ``PublishError`` reported — must be in the committed log exactly once
per (runId, sequence), and the worker must finish processing with no manual step.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pytest

from agentlog.infra.kafka import local
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher, PublishError
from agentlog.streams.reader import read_topic
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import load_settings
from tests.faults.gen import chain_of
from tests.faults.kafka_util import Offsets
from tests.faults.readback import stored_runs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import free_port_range

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.timeout(900)]

RUNS = 20
EVENTS_PER_RUN = 60




def test_one_broker_down_mid_publish_loses_no_acknowledged_event(tmp_path: Path, ledger):
    base = free_port_range(6)
    cluster = load_settings(home=tmp_path / "cluster", kafka_bootstrap=f"127.0.0.1:{base}")
    rng = random.Random(5)
    victim = rng.randrange(3)
    worker = None
    try:
        nodes = local.start(cluster, nodes=3)
        settings = load_settings(
            home=tmp_path / "worker", kafka_bootstrap=local.bootstrap_servers(nodes),
            topic_prefix=f"bl{uuid.uuid4().hex[:6]}", clickhouse_url=f"chdb://{tmp_path / 'ch'}",
            replication_factor=3, partitions=2, session_timeout_s=6.0,
        )
        asyncio.run(ensure_topics(settings))
        worker = WorkerProcess(settings, sink=False, log_name="broker-loss-worker").start()
        acked: dict[str, list[dict]] = {}
        resent = 0
        total = RUNS * EVENTS_PER_RUN
        stop_at, start_at = total // 3, 2 * total // 3

        async def scenario():
            nonlocal resent
            loop = asyncio.get_running_loop()
            node_ops: list[asyncio.Future] = []
            async with Publisher(settings, wire="avro") as pub:
                runs = [pub.run(f"bl-{uuid.uuid4().hex[:6]}-{i}") for i in range(RUNS)]
                pending: list[dict] = []
                sent = 0
                for round_ in range(EVENTS_PER_RUN):
                    for run in runs:
                        if round_ == 0:
                            doc = await run.emit("run.started", {"bindings": {"engineVersion": "1"}})
                        elif round_ == EVENTS_PER_RUN - 1:
                            doc = await run.emit("run.completed", {})
                        else:
                            doc = await run.emit("variable.changed", {"name": f"v{round_ % 4}", "value": round_})
                        pending.append(doc)
                        sent += 1
                        if sent == stop_at:  # stop the broker in the background while we keep emitting
                            node_ops.append(loop.run_in_executor(None, local.stop_node, cluster, victim))
                        if sent == start_at:
                            await asyncio.wait_for(asyncio.shield(node_ops[0]), timeout=120)
                            node_ops.append(loop.run_in_executor(None, local.start_node, cluster, victim))
                    try:
                        await pub.flush()
                    except PublishError as e:
                        # The SDK's documented recovery: re-send exactly what was not acknowledged.
                        resent += len(e.failed)
                        await pub.resend([doc for doc, _ in e.failed])
                    for doc in pending:
                        acked.setdefault(doc["runId"], []).append(doc)
                    pending = []
                    if round_ == 0:  # the worker must be up (its changelog topics created) before the loss
                        async with Offsets(settings) as offsets:
                            async def started():
                                return await offsets.log_end() >= RUNS

                            await wait_until(started, timeout=180, what="worker processing", worker=worker)
                    await asyncio.sleep(0.05)
            for op in node_ops:
                await asyncio.wait_for(op, timeout=240)

            async with Offsets(settings) as offsets:
                async def processed():
                    return await offsets.log_end() >= total and await offsets.drained(sink=False)

                await wait_until(processed, timeout=300, interval=1.0, what="worker caught up after the outage",
                                 worker=worker)
            log: dict[str, dict[int, dict]] = {}
            conflicts = 0
            async for _, _, _, rec in read_topic(settings, "log"):
                seen = log.setdefault(rec["doc"]["runId"], {})
                first = seen.setdefault(rec["doc"]["sequence"], rec)
                conflicts += first != rec
            rejections = [r async for _, _, _, r in read_topic(settings, "rejections")]
            return log, conflicts, rejections, await stored_runs(settings, acked)

        log, conflicts, rejections, stored = asyncio.run(scenario())
        assert worker.alive(), worker.log_tail()
        assert [n.alive for n in local.status(cluster)] == [True, True, True]
    finally:
        if worker is not None:
            worker.stop()
        local.stop(cluster, purge=True)

    assert conflicts == 0
    lost = 0
    for run_id, docs in stored.items():  # as the sequencer stores them (sealed under each run's key)
        got = log.get(run_id, {})
        lost += sum(1 for d in docs if d["sequence"] not in got)
        for doc, (_prev, h) in zip(docs, chain_of(docs), strict=False):
            assert got[doc["sequence"]]["doc"] == doc and got[doc["sequence"]]["hash"] == h
    accepted = sum(len(v) for v in acked.values())
    assert lost == 0 and accepted == total
    dup_rejections = [r for r in rejections if r["reason"] != "duplicate_event_id"]
    assert dup_rejections == [], dup_rejections[:3]
    ledger.record("broker_loss", sent=total, accepted=accepted, lost=lost, duplicated=conflicts,
                  rejected={r["reason"]: sum(1 for x in rejections if x["reason"] == r["reason"]) for r in rejections},
                  stopped_node=victim, resent_after_publish_error=resent)


def test_worker_started_while_a_broker_is_down_waits_for_it_then_processes(tmp_path: Path, ledger):
    """A worker started on a fresh prefix while one broker of three is down waits for it; no manual restart."""
    from aiokafka.admin import AIOKafkaAdminClient

    from agentlog.streams.publisher import publish_docs
    from agentlog.streams.topics import topic_name
    from tests.faults.gen import synthetic_run

    base = free_port_range(6)
    cluster = load_settings(home=tmp_path / "cluster", kafka_bootstrap=f"127.0.0.1:{base}")
    worker = None
    try:
        nodes = local.start(cluster, nodes=3)
        local.stop_node(cluster, 1)
        # Until the controller fences the stopped broker (its session times out), metadata still
        # lists it and replication-3 topics are created with it as an offline replica.
        bootstrap = local.bootstrap_servers(nodes)
        asyncio.run(wait_until(lambda: asyncio.sleep(0, len(local._probe(bootstrap)) == 2), timeout=120,
                               what="the stopped broker to be fenced"))
        settings = load_settings(
            home=tmp_path / "worker", kafka_bootstrap=local.bootstrap_servers(nodes),
            topic_prefix=f"bw{uuid.uuid4().hex[:6]}", clickhouse_url=f"chdb://{tmp_path / 'ch'}",
            replication_factor=3, partitions=2, session_timeout_s=6.0,
        )
        worker = WorkerProcess(settings, sink=False, log_name="broker-down-worker").start()

        async def says_waiting():
            # Kafka 4.1 places replicas on a fenced broker when too few are unfenced, so which wait the
            # worker hits depends on timing: our topic creation refused (INVALID_REPLICATION_FACTOR) or
            # the group coordinator living on the stopped broker. Either way it must wait, not die.
            text = worker.log_path.read_text(errors="replace")
            return "are all brokers up" in text or "GroupCoordinatorNotAvailable" in text

        asyncio.run(wait_until(says_waiting, timeout=180, what="the worker to say it waits for brokers",
                               worker=worker))
        local.start_node(cluster, 1)

        async def scenario():
            admin = AIOKafkaAdminClient(**client_kwargs(settings))
            await admin.start()
            try:
                async def topics_made():
                    return topic_name(settings, "log") in set(await admin.list_topics())

                await wait_until(topics_made, timeout=180, what="topics created once the broker is back",
                                 worker=worker)
            finally:
                await admin.close()
            rng = random.Random(3)
            runs = [synthetic_run(f"bw-{i}-{uuid.uuid4().hex[:4]}", 20, rng) for i in range(3)]
            docs = [d for run in runs for d in run]
            assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)
            async with Offsets(settings) as offsets:
                async def processed():
                    return await offsets.log_end() >= len(docs) and await offsets.drained(sink=False)

                await wait_until(processed, timeout=300, interval=1.0, what="worker processing after the wait",
                                 worker=worker)
            return len(docs)

        total = asyncio.run(scenario())
        assert worker.alive(), worker.log_tail()
        assert worker.starts == 1  # no manual restart
    finally:
        if worker is not None:
            worker.stop()
        local.stop(cluster, purge=True)
    ledger.record("worker_start_with_broker_down", sent=total, accepted=total, waited_for_node=1)
