"""Tampering with the committed log while the worker runs.

Two forgeries are appended to the log topic behind the sequencer's back:

* a rewritten copy of an already committed sequence ``k`` (same runId/sequence/eventId, altered
  payload, the original prevHash/hash kept): replay reports ``tampered`` at ``k``, and the live
  run-state check emits ``hash_chain_broken`` for that eventId when it consumes the copy;
* a forged *next* record (sequence = last + 1) whose prevHash is not the run's head: the live
  check emits ``hash_chain_broken`` for it as well.
"""

from __future__ import annotations

import asyncio
import copy
import random
import uuid

import pytest

from processors.replay.rederive import replay_run
from streams.admin import ensure_topics
from streams.publisher import publish_docs
from streams.reader import read_run, read_topic
from tests.faults.gen import synthetic_run
from tests.integration.replay.helpers import HandLog, digested
from tests.integration.worker.worker_proc import WorkerProcess, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.timeout(600)]


def test_rewritten_log_record_is_flagged_live_and_by_replay(settings, ledger):
    settings = settings.replace(snapshot_every=10)
    asyncio.run(ensure_topics(settings))
    run_id = f"tamper-{uuid.uuid4().hex[:8]}"
    docs = synthetic_run(run_id, 30, random.Random(11))
    k = next(i for i, d in enumerate(docs) if d["type"] == "variable.changed" and i > 3)
    worker = WorkerProcess(settings, sink=False, log_name="tamper-worker").start()

    async def scenario():
        assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)

        async def settled():
            return await digested(settings, run_id, len(docs)) is not None

        await wait_until(settled, timeout=180, what="every digest recorded", worker=worker)
        log = await read_run(settings, run_id)
        assert (await replay_run(settings, run_id)).verdict == "match"  # the control

        rewritten = copy.deepcopy(log[k])
        rewritten["doc"]["payload"]["value"] = -1
        forged_next = copy.deepcopy(log[-1])
        forged_next["doc"].update(eventId=f"{run_id}:forged", sequence=len(docs), type="variable.changed",
                                  payload={"name": "forged", "value": 1})
        forged_next["doc"].pop("causationId", None)
        forged_next["prevHash"] = "f" * 64
        async with HandLog(settings) as hand:
            await hand.send("log", run_id, rewritten)
            await hand.send("log", run_id, forged_next)

        async def flagged():
            found = {(v["eventId"], v["code"]) async for _, _, _, v in read_topic(settings, "violations", key=run_id)
                     if v["runId"] == run_id}
            return found if len(found) >= 2 else None

        found = await wait_until(flagged, timeout=120, what="hash_chain_broken violations", worker=worker)
        assert found == {(docs[k]["eventId"], "hash_chain_broken"), (f"{run_id}:forged", "hash_chain_broken")}
        assert (await read_run(settings, run_id)).conflicts  # readers keep the first copy and note the other
        result = await replay_run(settings, run_id, from_seq=0)
        return result

    try:
        result = asyncio.run(scenario())
        assert worker.alive()
    finally:
        worker.stop()
    assert result.verdict == "diverged"
    d = result.first_divergence
    assert (d.at_sequence, d.kind) == (k, "tampered")
    assert (d.path, d.expected, d.actual) == ("doc.payload.value", docs[k]["payload"]["value"], -1)
    ledger.record("tamper", sent=len(docs), accepted=len(docs), violations={"hash_chain_broken": 2},
                  forged_records=2, replay_first_divergence=f"{d.kind}@{d.at_sequence}")
