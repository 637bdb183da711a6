"""SIGKILL the worker (audit sink included) again and again while tens of thousands of events stream in.

Afterwards, against oracles computed here from the published docs alone:

* the committed log holds every event exactly once per (runId, sequence), with no conflicting copy,
  and its hash chain is the chain recomputed from the docs;
* ClickHouse, read WITHOUT FINAL: ``SELECT count() FROM events`` = events sent, one row per
  (runId, sequence) with the same hashes, and every other audit table holds exactly one row per
  distinct record of its topic (the topics themselves may hold redelivered copies);
* every run's final snapshot is at its last sequence and equals the clean offline fold
  (variables, channels, status and the handoff machines), with the right head hash;
* nothing was rejected and nothing was flagged;
* every run verifies against the worker's signed checkpoints: redelivered checkpoints are
  byte-identical, and every terminal event is signed despite the kills.

Size: ``AGENTLOG_FAULT_EVENTS`` events (default below), 100 per synthetic run, plus realistic
handoff families (planner + children) from tests/unit/core/runs.py; ``AGENTLOG_FAULT_KILLS`` SIGKILLs
(default 10); ``AGENTLOG_FAULT_SEED`` picks the interleaving and the kill points.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter

import pytest

from agentlog.audit.exactly_once import ledger_gaps
from agentlog.audit.store import open_store
from agentlog.core.checkpoint import key_id, load_public_key, verify_history
from agentlog.streams.admin import ensure_topics
from agentlog.streams.codec import encode_record
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_run, read_topic
from tests.faults.gen import chain_of, mixed_stream
from tests.faults.kafka_util import Offsets
from tests.faults.readback import check_runs, read_outputs, sealed_runs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(1800)]

# The suite's target is >= 50k events and >= 10 kills; both are the defaults. Kills follow random log
# thresholds with no minimum gap, so some land a fraction of a second after the previous restart,
# while the group is still rebalancing or recovering its tables.
# AGENTLOG_FAULT_MIN_KILL_GAP_S spaces them out.
DEFAULT_EVENTS = 50_000
EVENTS = int(os.environ.get("AGENTLOG_FAULT_EVENTS", DEFAULT_EVENTS))
PER_RUN = 100
FAMILIES = 6
KILLS = int(os.environ.get("AGENTLOG_FAULT_KILLS", 10))
MIN_KILL_GAP_S = float(os.environ.get("AGENTLOG_FAULT_MIN_KILL_GAP_S", 0.0))
CHUNK = 1000



def test_sigkill_worker_with_sink_loses_and_duplicates_nothing(settings, ledger):
    rng = random.Random(int(os.environ.get("AGENTLOG_FAULT_SEED", "8")))
    settings = settings.replace(session_timeout_s=6.0)
    asyncio.run(ensure_topics(settings))
    runs, stream = mixed_stream(rng, events=EVENTS, families=FAMILIES, per_run=PER_RUN, name="crash")
    total = len(stream)
    assert total >= EVENTS
    worker = WorkerProcess(settings, sink=True, log_name="crash-worker",
                           constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 25}).start()
    t0 = time.monotonic()
    kills: list[int] = []

    async def publish(offsets: Offsets) -> None:
        """Publish in chunks, keeping at most a few chunks ahead of the log so kills hit a live stream."""
        async with Publisher(settings, wire="avro") as pub:
            for start in range(0, total, CHUNK):
                for doc in stream[start:start + CHUNK]:
                    await pub.send_doc(doc)
                await pub.flush()  # raises PublishError on any unacknowledged record

                async def caught_up(limit=start - 3 * CHUNK):
                    return await offsets.log_end() >= limit

                await wait_until(caught_up, timeout=600, interval=0.3, what="log to follow the publisher")

    async def kill_loop(offsets: Offsets) -> None:
        """Kill when the log passes random thresholds spread over the stream; restart at once."""
        thresholds = sorted(rng.sample(range(total // 20, total * 9 // 10), KILLS))
        last_kill = -1e9
        for threshold in thresholds:
            async def reached(t=threshold):
                return await offsets.log_end() >= t

            await wait_until(reached, timeout=600, interval=0.2, what=f"log end >= {threshold}", worker=worker)
            await asyncio.sleep(max(rng.uniform(0.0, 1.0), last_kill + MIN_KILL_GAP_S - time.monotonic()))
            last_kill = time.monotonic()
            kills.append(await offsets.log_end())
            worker.kill()
            worker.start()

    async def scenario() -> None:
        async with Offsets(settings) as offsets:
            await asyncio.gather(publish(offsets), kill_loop(offsets))

            async def drained():
                rejected = sum((await offsets.ends(("rejections",))).values())
                if rejected:  # nothing in this stream is bad: any rejection is an event lost to a crash
                    reasons = Counter([r["reason"] async for _, _, _, r in read_topic(settings, "rejections")])
                    ledger.record("worker_crashes", sent=total, accepted=total - rejected, rejected=dict(reasons),
                                  lost=rejected, kills=len(kills), kill_points_log_end=kills,
                                  seconds=round(time.monotonic() - t0, 1), failed=True)
                    raise AssertionError(f"{rejected} events rejected after crashes (lost): {dict(reasons)}")
                # Faust's group consumes ingest (sequencing and the fold in one pass) and handoff-links;
                # the audit sink is its own consumer group over the output topics (it resumes from
                # ClickHouse; its commits are for lag only).
                return await offsets.log_end() >= total and await offsets.drained(sink=True)

            await wait_until(drained, timeout=300 + total / 100, interval=1.0, what="worker group drained",
                             worker=worker)

    try:
        asyncio.run(scenario())
        drained_after = time.monotonic() - t0
        worker_log = worker.log_tail(40)
    finally:
        worker.stop()
    assert worker.starts == KILLS + 1

    # --- the committed log, read once, deduplicated as every reader does -----------------------
    async def read_back():
        out = await read_outputs(settings)
        transitions = set()
        keys: dict[str, set] = {"transitions": set(), "snapshots": set(), "replay_verdicts": set(),
                                "checkpoints": set()}
        async for _, _, _, t in read_topic(settings, "transitions"):
            transitions.add((t["parentRunId"], t["eventId"]))
            keys["transitions"].add((t["parentRunId"], t["dispatchId"], t["phase"]))
        async for _, _, _, snap in read_topic(settings, "snapshots"):
            keys["snapshots"].add((snap["runId"], snap["atSequence"]))
        async for _, _, _, v in read_topic(settings, "verdicts"):
            keys["replay_verdicts"].add(encode_record(v))
        sink_keys.update(keys)
        sample = [await read_run(settings, r) for r in list(runs)[:3]]
        signed: dict[str, list[dict]] = {}
        async for _, _, _, cp in read_topic(settings, "checkpoints"):
            signed.setdefault(cp["runId"], []).append(cp)
            keys["checkpoints"].add((cp["runId"], cp["sequence"], cp["keyId"]))
        return out, transitions, sample, signed

    sink_keys: dict[str, set] = {}
    out, transitions, sample, signed = asyncio.run(read_back())
    assert all(s.conflicts == [] for s in sample)
    lost = check_runs(runs, out)
    log, copies, conflicts, rejections, violations = out.log, out.copies, out.conflicts, out.rejections, out.violations
    assert sum(len(v) for k, v in log.items() if k in runs) == total
    public = load_public_key((settings.home / "keys" / "ed25519.pub.pem").read_bytes())
    unverified = {}
    for run_id in runs:
        result = verify_history(run_id, [log[run_id][s] for s in sorted(log[run_id])], signed.get(run_id, []),
                                {key_id(public): public})
        if not result.verified:
            unverified[run_id] = result.failure
    assert unverified == {}, dict(list(unverified.items())[:3])
    checkpoint_copies = sum(len(v) for k, v in signed.items() if k in runs)
    expected_transitions = {(d["runId"], d["eventId"]) for docs in runs.values() for d in docs
                            if d["type"] == "core.workflowChain.event"}
    assert expected_transitions <= transitions

    # --- ClickHouse: stop the worker first (it owns the chdb directory) ------------------------
    with open_store(settings) as store:
        tables = ("events", "transitions", "violations", "rejections", "snapshots", "replay_verdicts",
                  "checkpoints")
        counts = {t: store.query(f"SELECT count() FROM {t}").rows[0][0] for t in tables}  # no FINAL
        dup_rows = store.query(
            "SELECT run_id, sequence, count() AS c FROM events GROUP BY run_id, sequence HAVING c > 1 LIMIT 5"
        ).rows
        hashes = dict(((r, s), h) for r, s, h in store.query("SELECT run_id, sequence, hash FROM events").rows)
        gaps = ledger_gaps(store)
        # the rollups must hold every event once too: a SIGKILL can fall between the events part and the views
        rollups = {
            "run_rollup_events": store.query("SELECT sum(events) FROM run_rollup").rows[0][0],
            "usage_hourly_calls": store.query("SELECT sum(calls) FROM usage_hourly").rows[0][0],
            "usage_events": store.query("SELECT count() FROM events WHERE type = 'provider.usage'").rows[0][0],
        }
    # What the sink's defences did in this run (its warnings, one line each): re-reads that brought records a fetch
    # had skipped, and re-formed inserts ClickHouse dropped as duplicates although their rows were missing.
    sink_log = worker.log_path.read_text(errors="replace")
    defences = {"skipped_records_reread": sink_log.count("which a fetch had skipped"),
                "dropped_tokens": sink_log.count("dropped as a duplicate but"),
                "rollups_repaired": sink_log.count("repaired from events")}
    assert gaps == [], gaps
    assert rollups["run_rollup_events"] == total and rollups["usage_hourly_calls"] == rollups["usage_events"], rollups
    assert dup_rows == []
    assert counts["events"] == len(hashes) == total
    assert counts["violations"] == len(violations) == 0 and counts["rejections"] == len(rejections) == 0
    for table, distinct_records in sink_keys.items():
        assert counts[table] == len(distinct_records), (table, counts[table], len(distinct_records))
    for run_id, docs in sealed_runs(runs, out.keyring).items():
        for doc, (_, h) in zip(docs, chain_of(docs), strict=False):
            assert hashes[(run_id, doc["sequence"])] == h
    ledger.record(
        "worker_crashes", sent=total, accepted=total, lost=lost, duplicated=conflicts + len(dup_rows),
        runs=len(runs), kills=len(kills), kill_points_log_end=kills, log_redelivered_copies=copies,
        clickhouse_counts_without_final=counts, rollups=rollups, sink_defences=defences,
        seconds_to_drain=round(drained_after, 1), runs_verified_by_signature=len(runs),
        checkpoint_records=checkpoint_copies,
    )
    del worker_log


def _has(store, table: str) -> bool:
    return bool(store.query("EXISTS TABLE {t:Identifier}", {"t": table}).rows[0][0])
