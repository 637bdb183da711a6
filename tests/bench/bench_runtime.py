"""What exactly-once by Kafka transactions costs here, with and without the sequencer's work: the runtime's ceilings.

Every path reads the same N realistic events (:mod:`tests.bench.workload`: multi-agent runs, 1,000 trees in flight)
from its own ``ingest`` topic and writes one record per event to its ``log`` topic (acks=all), on the same broker
in the same run. Throughput = N / (last log record's broker timestamp − first one's), as in ``bench_process``.

- ``bare``: one aiokafka consumer + idempotent producer copying the bytes (``bench_process``'s baseline);
- ``bare_tx``: the same in Kafka transactions: each fetched batch's records and its consumed offsets
  (``send_offsets_to_transaction``) in one transaction, the consumer reading committed records only;
- ``faust_eos``: Faust's pass-through agent (:mod:`tests.bench.passthrough_faust`) under Faust's own
  ``processing_guarantee="exactly_once"``;
- ``work_tx``: ``bare_tx`` doing the sequencer's whole per-event work, as the worker does it (decode, validate,
  redact by the default policy, seal under the run's data key, decide, fold, state hash, the committed record),
  with each new run's keyring record and, once per batch, every touched run's record on a changelog topic
  (what a restart restores from), in the same transaction as the log records and the offsets. State is in
  dicts: this is the ceiling of a sequencer on aiokafka transactions before any table store.

- ``work_us_by_step``: that per-event work again in this process, without a broker, each step timed on its own
  (``_stages``), and ``work_ceiling``: the most a loop can move that does bare's work and this work and nothing
  else, ``1 / (1 / bare + work)``. It is the part of the gap to bare that no runtime can close.

``ours`` is ``work_tx`` and ``baseline`` is ``bare``: the ratio the runtime issue's goal is stated against (≥ 0.35×;
the worker today: ``bench_txprocess``'s ratio).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agentlog.streams.admin import ensure_topics
from agentlog.streams.security import client_kwargs
from agentlog.streams.settings import Settings
from agentlog.streams.topics import topic_name
from tests.bench import PASSTHROUGH_ARGS, BenchContext, own, workload
from tests.bench.bench_process import _bare, _run_subprocess, _span, from_the_start

REPO = Path(__file__).resolve().parents[2]
#: Records one transaction holds at most (one ``getmany``): the worker's batch size.
BATCH = 2000


def _consumer(settings: Settings, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**client_kwargs(settings), group_id=group, enable_auto_commit=False,
                            auto_offset_reset="earliest", isolation_level="read_committed")


def _tx_producer(settings: Settings, tx_id: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(**client_kwargs(settings), transactional_id=tx_id, enable_idempotence=True, acks="all",
                            linger_ms=5, max_batch_size=1 << 20)


async def _tx_loop(settings: Settings, n: int, work: Any = None) -> float:
    """Consume → produce in transactions; ``work(tp, messages, send)`` replaces the copy of the bytes.

    ``send(topic, value, key=)`` enqueues a record of the batch's transaction; the transaction sends its offsets once
    every record of it is acknowledged.
    """
    group = f"{settings.topic_prefix}-tx"
    consumer, producer = _consumer(settings, group), _tx_producer(settings, f"{settings.topic_prefix}-tx-0")
    await consumer.start()
    await producer.start()
    log_topic = topic_name(settings, "log")
    try:
        await from_the_start(consumer, settings)
        sent: list[asyncio.Future[Any]] = []

        async def send(topic: str, value: bytes, *, key: bytes | None = None) -> None:
            sent.append(await producer.send(topic, value, key=key))

        done = 0
        while done < n:
            batches = await consumer.getmany(timeout_ms=500, max_records=BATCH)
            if not batches:
                continue
            sent.clear()
            async with producer.transaction():
                for tp, messages in batches.items():
                    if work is None:
                        for m in messages:
                            await send(log_topic, m.value, key=m.key)
                    else:
                        await work(tp, messages, send)
                    done += len(messages)
                # The records first, then the offsets, as the worker's writer does: Kafka 4.1 verifies a
                # transaction's produce with its coordinator (KIP-890), which answers CONCURRENT_TRANSACTIONS
                # (aiokafka: NotEnoughReplicas, retried after a backoff) while it records the offsets' partition.
                await asyncio.gather(*sent)
                await producer.send_offsets_to_transaction(
                    {tp: messages[-1].offset + 1 for tp, messages in batches.items()}, group)
    finally:
        await producer.stop()
        await consumer.stop()
    return await _span(settings, "log", n, timeout=60)


def _sequencer_work(settings: Settings) -> Any:
    """The worker's per-event work (see the module docstring), its state in dicts."""
    from agentlog.core.keyring import LocalKek, mint
    from agentlog.core.redaction import Redactor
    from agentlog.core.runstate import fold_next
    from agentlog.core.sealing import seal_event
    from agentlog.core.sequencing import Accepted, Source, sequence
    from agentlog.streams.codec import encode_committed, encode_record

    kek, redactor = LocalKek(os.urandom(32)), Redactor()
    keys: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    index: dict[str, Any] = {}
    log_topic, keyring_topic = topic_name(settings, "log"), topic_name(settings, "keyring")
    changelog = topic_name(settings, "transitions")  # any topic of the prefix: the run records' stand-in changelog

    async def work(tp: TopicPartition, messages: list[Any], send: Any) -> None:
        touched: set[str] = set()
        for m in messages:
            minted: list[Any] = []

            def key_of(run_id: str, minted: list[Any] = minted) -> Any:
                if run_id not in keys:
                    keys[run_id], rec = mint(run_id, None, None, kek)
                    minted.append(rec)
                return keys[run_id]

            def head_of(run_id: str) -> Any:
                rec = runs.get(run_id)
                return None if rec is None else {"next": rec["next"], "hash": rec["head"]}

            decoded = sequence(m.value, head_of, lambda run_id: lambda e, r=run_id: index.get(r + "\x1f" + e),
                               Source(tp.topic, tp.partition, m.offset, m.timestamp), max_bytes=1 << 20,
                               seal=lambda doc: seal_event(redactor.stored(doc), key_of(doc["runId"])))
            for rec in minted:
                await send(keyring_topic, rec.to_value(), key=rec.run_id.encode())
            decision = decoded.decision
            if not isinstance(decision, Accepted):
                continue
            c = decision.committed
            doc = c["doc"]
            run_id = doc["runId"]
            adv = fold_next(runs.get(run_id), doc, c["hash"], snapshot_every=100, handoff_mode="auto",
                            ts_ms=m.timestamp)
            runs[run_id] = adv.record
            event_id, entry = decision.index_entry
            index[run_id + "\x1f" + event_id] = entry
            touched.add(run_id)
            await send(log_topic, encode_committed(decision.doc_bytes, c["prevHash"], c["hash"], c["source"],
                                                   adv.state_hash), key=run_id.encode())
        for run_id in touched:
            await send(changelog, encode_record(runs[run_id]), key=run_id.encode())

    return work


def _stages(n: int) -> dict[str, float]:
    """µs an event of each step of the sequencer's work on ``n`` workload events, in this process, without a broker.

    The steps of ``_sequencer_work`` one at a time, each timed around its own call: decode, validate, redact,
    mint a new run's data key (and its keyring record), seal, decide and chain (JCS + SHA-256 of the sealed doc),
    fold (with the state hash), the committed record, and each touched run's record as the state tables encode it,
    once a batch of ``BATCH`` events as the worker writes it. The heap is frozen after each batch, as the worker's
    pacer does, so a step's figure holds the young collections its own garbage costs.
    """
    from agentlog.core.keyring import LocalKek, mint
    from agentlog.core.redaction import Redactor
    from agentlog.core.runstate import Advanced, fold_next
    from agentlog.core.sealing import seal_event
    from agentlog.core.sequencing import Accepted, Source, decide
    from agentlog.schemas.validate import validate_parsed
    from agentlog.streams.codec import decode_ingest, encode_committed
    from agentlog.worker.tables import encode

    kek, redactor = LocalKek(os.urandom(32)), Redactor()
    keys: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    index: dict[str, Any] = {}
    took: dict[str, float] = dict.fromkeys(("decode", "validate", "redact", "key", "seal", "chain", "fold", "record",
                                            "state"), 0.0)
    clock = time.perf_counter
    touched: set[str] = set()
    for i, (_, raw) in enumerate(workload.events("stages", n)):
        t0 = clock()
        doc = decode_ingest(raw)
        t1 = clock()
        doc_bytes = validate_parsed(doc, max_bytes=1 << 20)
        t2 = clock()
        redacted = redactor.stored(doc)
        t3 = clock()
        run_id = doc["runId"]
        key = keys.get(run_id)
        if key is None:
            key, minted = mint(run_id, None, None, kek)
            keys[run_id] = key
            minted.to_value()
        t4 = clock()
        sealed = seal_event(redacted, key)
        t5 = clock()
        rec = runs.get(run_id)
        head = None if rec is None else {"next": rec["next"], "hash": rec["head"]}
        decision = decide(head, lambda e, r=run_id: index.get(r + "\x1f" + e), doc,
                          Source("ingest", 0, i, 1_700_000_000_000 + i), doc_bytes, lambda _doc, s=sealed: s)
        t6 = clock()
        took["decode"] += t1 - t0
        took["validate"] += t2 - t1
        took["redact"] += t3 - t2
        took["key"] += t4 - t3
        took["seal"] += t5 - t4
        took["chain"] += t6 - t5
        if not isinstance(decision, Accepted):
            continue
        c = decision.committed
        adv = fold_next(rec, c["doc"], c["hash"], snapshot_every=100, handoff_mode="auto", ts_ms=1_700_000_000_000 + i)
        t7 = clock()
        assert isinstance(adv, Advanced), adv
        runs[run_id] = adv.record
        event_id, entry = decision.index_entry
        index[run_id + "\x1f" + event_id] = entry
        touched.add(run_id)
        encode_committed(decision.doc_bytes, c["prevHash"], c["hash"], c["source"], adv.state_hash)
        t8 = clock()
        took["fold"] += t7 - t6
        took["record"] += t8 - t7
        if (i + 1) % BATCH == 0 or i + 1 == n:
            t9 = clock()
            for touched_id in touched:
                encode(runs[touched_id])
            took["state"] += clock() - t9
            touched.clear()
            gc.freeze()  # as the worker's pacer does (agentlog.worker.gcpause): collections walk what came since
    gc.unfreeze()
    return {name: seconds / n * 1e6 for name, seconds in took.items()}


def variants(ctx: BenchContext, home: Path, prefix: str, n: int) -> Callable[[str], Settings]:
    """A maker of one path's settings: its own topics (4 partitions) under ``home``, ``n`` realistic events published."""

    def variant(name: str) -> Settings:
        s = ctx.settings.replace(topic_prefix=own(f"{prefix}{name}{uuid.uuid4().hex[:6]}"), home=home / name,
                                 partitions=4, replication_factor=1, otlp_port=0)
        asyncio.run(ensure_topics(s))
        asyncio.run(workload.publish(s, f"{name}-run", n, concurrent=1000))
        return s

    return variant


def baselines(variant: Callable[[str], Settings], n: int) -> tuple[float, float]:
    """Bare aiokafka consume -> produce of ``n`` events, without and with transactions (events/s), each on its own
    topics from ``variant``."""
    bare = n / asyncio.run(_bare(variant("bare"), n))
    bare_tx = n / asyncio.run(_tx_loop(variant("baretx"), n))
    return bare, bare_tx


def run(ctx: BenchContext) -> dict:
    n = 5_000 if ctx.quick else 50_000
    home = REPO / ".agentlog" / "bench" / f"runtime-{uuid.uuid4().hex[:6]}"
    variant = variants(ctx, home, "benchrt", n)

    bare, bare_tx = baselines(variant, n)
    faust_eos = n / _run_subprocess(variant("eos"), PASSTHROUGH_ARGS, n, home / "faust-eos.log",
                                    env={"PASSTHROUGH_GUARANTEE": "exactly_once"})
    work = variant("worktx")
    work_tx = n / asyncio.run(_tx_loop(work, n, _sequencer_work(work)))
    stages = _stages(n)
    work_us = sum(stages.values())
    # The most a loop can move that does bare's work and the sequencer's, and nothing else (no record beyond the
    # log's, no transaction, no table store): what the per-event work alone leaves of bare.
    ceiling = 1e6 / (1e6 / bare + work_us)
    return {
        "ours": work_tx,
        "baseline": bare,
        "unit": "events/s (realistic runs)",
        "goal_ratio": 0.35,
        "details": {"events": n, "batch": BATCH, "bare_events_per_s": bare, "bare_tx_events_per_s": bare_tx,
                    "faust_eos_passthrough_events_per_s": faust_eos, "work_tx_events_per_s": work_tx,
                    "bare_tx_vs_bare": bare_tx / bare, "faust_eos_vs_bare": faust_eos / bare,
                    "work_tx_vs_bare": work_tx / bare, "work_tx_vs_bare_tx": work_tx / bare_tx,
                    "work_us_per_event": work_us, "work_us_by_step": stages,
                    "bare_us_per_event": 1e6 / bare, "work_ceiling_events_per_s": ceiling,
                    "work_ceiling_vs_bare": ceiling / bare},
    }
