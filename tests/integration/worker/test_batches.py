"""Every way a batch can be fetched still commits each run whole.

A real worker gets a trickle (a fetch of a few records each), bursts (fetches of many), and a burst followed by
silence (the last fetch is handled with no later record to push it along). Each run must end up committed once per
sequence, in order, with an unbroken hash chain, and the stateful outputs (snapshots) must follow.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentlog.schemas.canonical import GENESIS, chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import Publisher
from agentlog.streams.reader import read_run, read_topic
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import stored_docs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

RUNS = 8


@pytest.fixture
def batch_worker(settings):
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings, constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 25}).start()
    yield proc
    proc.stop()


async def _committed(settings, run_id: str, n: int):
    committed = await read_run(settings, run_id)
    return committed if len(committed) >= n else None


def test_trickle_bursts_and_a_burst_before_silence_all_commit_in_order(settings, batch_worker):
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"ad-{tag}-{r}" for r in range(RUNS)]

    async def scenario() -> dict[str, list[dict]]:
        sent: dict[str, list[dict]] = {r: [] for r in run_ids}
        async with Publisher(settings, linger_ms=1) as pub:
            runs = [pub.run(r) for r in run_ids]
            for run in runs:
                sent[run.run_id].append(await run.emit("run.started", {"bindings": {}}))
            await pub.flush()
            for i in range(30):  # trickle: a few records per tick
                run = runs[i % RUNS]
                sent[run.run_id].append(await run.emit("variable.changed", {"name": "t", "value": i}))
                await pub.flush()
                await asyncio.sleep(0.01)
            for burst in range(3):  # bursts, the last one followed by silence
                for i in range(800):
                    run = runs[i % RUNS]
                    sent[run.run_id].append(await run.emit("variable.changed", {"name": f"b{burst}", "value": i}))
                await pub.flush()
                await asyncio.sleep(0.5)
        for run_id in run_ids:
            await wait_until(lambda run_id=run_id: _committed(settings, run_id, len(sent[run_id])),
                             what=f"committed log of {run_id}", worker=batch_worker)
        return sent

    sent = asyncio.run(scenario())

    async def check() -> None:
        snapshots = [v async for _, _, _, v in read_topic(settings, "snapshots")]
        for run_id, docs in sent.items():
            committed = await read_run(settings, run_id)
            assert [c["doc"] for c in committed] == docs
            assert not committed.conflicts
            head = GENESIS
            for c, doc in zip(committed, await stored_docs(settings, run_id), strict=True):
                assert c["prevHash"] == head
                head = chain_hash(head, doc)
                assert c["hash"] == head and isinstance(c.get("stateHash"), str)
            at = {s["atSequence"] for s in snapshots if s["runId"] == run_id}
            assert {s for s in range(len(docs)) if (s + 1) % 25 == 0} <= at

    asyncio.run(check())
