"""Tampering with the committed log while the worker runs.

First, a forger who can replace the whole log (delete and re-create the topic, or write the
audit tables) rewrites one event and recomputes every ``hash`` and ``stateHash`` after it, and
keeps the worker's checkpoints: the chain checks out, ``agentlog replay`` says ``match``, and only
``agentlog verify`` (the signed checkpoints) fails, naming the first unverified index.
The forged log is written under another topic prefix, standing for the replaced topic.

Then two forgeries are appended to the log topic behind the sequencer's back:

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

from agentlog.core.checkpoint import key_id, load_public_key
from agentlog.replay.rederive import replay_run
from agentlog.replay.verify import load_from_log, verify_run
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run, read_topic
from tests.faults.gen import synthetic_run
from tests.integration.replay.helpers import HandLog, committed, records_of
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.core.forgery import forge

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.timeout(600)]


def test_rewritten_log_record_is_flagged_live_and_by_replay(settings, ledger):
    settings = settings.replace(checkpoint_every=10)
    asyncio.run(ensure_topics(settings))
    run_id = f"tamper-{uuid.uuid4().hex[:8]}"
    docs = synthetic_run(run_id, 30, random.Random(11))
    k = next(i for i, d in enumerate(docs) if d["type"] == "variable.changed" and i > 3)
    worker = WorkerProcess(settings, sink=False, log_name="tamper-worker",
                           constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": 10}).start()

    async def scenario():
        assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)

        await wait_until(lambda: committed(settings, run_id, len(docs)), timeout=180, what="every event committed",
                         worker=worker)

        async def signed():
            return any(c["sequence"] == len(docs) - 1 for c in await records_of(settings, "checkpoints", run_id))

        await wait_until(signed, timeout=120, what="the terminal checkpoint", worker=worker)
        log = await read_run(settings, run_id)
        assert (await replay_run(settings, run_id)).verdict == "match"  # the control
        pub = load_public_key((settings.home / "keys" / "ed25519.pub.pem").read_bytes())
        keys = {key_id(pub): pub}
        untouched = verify_run(await load_from_log(settings, run_id), run_id, keys, handoff_mode="auto")
        assert untouched.verified, untouched.failure

        # The forger replaces the log: event k rewritten, every later hash and stateHash recomputed,
        # the worker's checkpoints kept (it cannot sign new ones without the worker's private key).
        forged = forge(list(log), k, lambda d: d["payload"].update(value=-1))
        replaced = settings.replace(topic_prefix=settings.topic_prefix + "-replaced")
        async with HandLog(replaced) as hand:
            await hand.log(forged)
            for cp in await records_of(settings, "checkpoints", run_id):
                await hand.send("checkpoints", run_id, cp)
        assert (await replay_run(replaced, run_id, from_seq=0)).verdict == "match"  # today's check passes
        caught = verify_run(await load_from_log(replaced, run_id), run_id, keys, handoff_mode="auto")

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
        appended = verify_run(await load_from_log(settings, run_id), run_id, keys, handoff_mode="auto")
        return result, caught, appended

    try:
        result, caught, appended = asyncio.run(scenario())
        assert worker.alive()
    finally:
        worker.stop()
    assert result.verdict == "diverged"
    d = result.first_divergence
    assert (d.at_sequence, d.kind) == (k, "tampered")
    assert (d.path, d.expected, d.actual) == ("doc.payload.value", docs[k]["payload"]["value"], -1)
    f = caught.failure
    assert f is not None and f.code == "checkpoint_mismatch", caught
    assert f.at_sequence == k // 10 * 10 and f.checkpoint_sequence == k // 10 * 10 + 9  # the span k lies in
    assert caught.last_signed == (k // 10 * 10 - 1 if k >= 10 else None)
    # the appended copies: the rewritten one is a later copy (readers keep the first), the forged next
    # record does not continue the chain
    assert appended.failure is not None and (appended.failure.code, appended.failure.at_sequence) == (
        "hash_chain_broken", len(docs)), appended
    ledger.record("tamper", sent=len(docs), accepted=len(docs), violations={"hash_chain_broken": 2},
                  forged_records=2, replay_first_divergence=f"{d.kind}@{d.at_sequence}",
                  verify_first_forged=f"{f.code}@{f.at_sequence}..{f.checkpoint_sequence} (rewritten: {k}; "
                                      f"replay of the rewrite: match)")
