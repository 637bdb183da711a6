"""SIGKILL the worker mid-stream and restart it: nothing lost, nothing different, heads equal.

The oracle is independent of the worker: the published documents themselves
(the committed log must equal them, per run, once deduplicated by sequence),
head hashes recomputed here with ``chain_hash``, and the offline fold of the same
documents for the final snapshot state.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from agentlog.core.fold import fold_all, state_hash
from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run, read_topic
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import stored_docs
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(900)]

RUNS = 24
KILLS = 3


def test_sigkill_mid_stream_then_restart_equals_clean_run(settings):
    rng = random.Random(7)
    settings = settings.replace(session_timeout_s=6.0)
    asyncio.run(ensure_topics(settings))
    runs = {f"crash-{uuid.uuid4().hex[:6]}-{i}": None for i in range(RUNS)}
    for run_id in runs:
        runs[run_id] = realistic_run(run_id, mode="check")
    # Interleave the runs' events (each run stays in order), as many hosts would.
    cursors = {r: 0 for r in runs}
    stream: list[dict] = []
    while cursors:
        run_id = rng.choice(sorted(cursors))
        stream.append(runs[run_id][cursors[run_id]])
        cursors[run_id] += 1
        if cursors[run_id] == len(runs[run_id]):
            del cursors[run_id]
    chunks = [stream[i:i + 40] for i in range(0, len(stream), 40)]
    worker = WorkerProcess(settings, constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 7}).start()

    async def scenario():
        kill_at = sorted(rng.sample(range(2, len(chunks) - 1), KILLS))
        for i, chunk in enumerate(chunks):
            summary = await publish_docs(settings, chunk, wire="avro")
            assert summary.accepted == len(chunk), summary.rejected
            if i in kill_at:
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                worker.kill()
                worker.start()
            await asyncio.sleep(0.1)

        async def all_committed():
            for run_id, docs in runs.items():
                if len(await read_run(settings, run_id)) < len(docs):
                    return False
            return True

        await wait_until(all_committed, timeout=300, what="every run fully committed", worker=worker)
        stored: dict[str, list[dict]] = {}  # the committed docs as stored (sealed): what the hashes cover
        for run_id, docs in runs.items():
            committed = await read_run(settings, run_id)
            assert committed.conflicts == [], f"different records at the same (runId, sequence) in {run_id}"
            assert [c["doc"] for c in committed] == docs
            stored[run_id] = await stored_docs(settings, run_id)
            head = GENESIS
            for c, doc in zip(committed, stored[run_id], strict=True):
                assert c["prevHash"] == head
                head = chain_hash(head, doc)
                assert c["hash"] == head

        async def final_snapshots():
            latest: dict[str, dict] = {}
            async for _, _, key, snap in read_topic(settings, "snapshots"):
                if key in runs and snap["atSequence"] >= latest.get(key, {}).get("atSequence", -1):
                    latest[key] = snap
            done = all(latest.get(r, {}).get("atSequence") == len(d) - 1 for r, d in runs.items())
            return latest if done else None

        latest = await wait_until(final_snapshots, timeout=180, what="final snapshots", worker=worker)
        for run_id in runs:
            clean_state, _ = fold_all(stored[run_id])
            snap = latest[run_id]
            assert snap["state"] == clean_state
            assert snap["stateHash"] == state_hash(clean_state)
            head = GENESIS
            for doc in stored[run_id]:
                head = chain_hash(head, doc)
            assert snap["headHash"] == head

        # Transitions: every host-emitted chain event appears (at least once; readers dedup by dispatch+phase).
        expected = {(d["runId"], d["eventId"]) for docs in runs.values() for d in docs
                    if d["type"] == "core.workflowChain.event"}
        seen = {(t["parentRunId"], t["eventId"]) async for _, _, _, t in read_topic(settings, "transitions")}
        assert expected <= seen
        violations = [v async for _, _, _, v in read_topic(settings, "violations") if v["runId"] in runs]
        assert violations == []

    try:
        asyncio.run(scenario())
    finally:
        worker.stop()
    assert worker.starts == KILLS + 1
