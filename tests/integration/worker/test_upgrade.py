"""A one-pass worker started on topics and changelogs written by the two-hop version (#13).

The two-hop worker's run-state agent folded the log behind the sequencer, so its ``runs``
table could lag the ``heads`` table, and its log records were format 1 (no stateHash).
Here those tables and records are written by hand as that version left them; the new
worker must carry the run on: fold the gap from the log, and commit the next events in
format 2 with the state hash the reference fold gives (``states_by_index``).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from processors.core.fold import states_by_index
from processors.replay import replay_run
from processors.worker.app import build_app, internal_topic_specs
from streams.admin import ensure_topics, ensure_topics_patiently
from streams.publisher import publish_docs
from streams.reader import partition_for, read_run
from streams.security import client_kwargs
from tests.integration.replay.helpers import HandLog, chained, committed
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def test_worker_continues_a_run_whose_old_run_state_lagged_its_head(settings):
    run_id = f"up-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k, lag = 12, 5  # the old sequencer committed 0..k-1; its run-state agent had folded 0..lag-1
    states = states_by_index(docs)
    old_log = chained(docs[:k])
    wiring = build_app(settings.replace(worker_role="process"), replay=False)
    changelogs = {name: t.changelog_topic.get_topic_name() for name, t in wiring.tables.items()}

    async def scenario():
        await ensure_topics(settings)
        await ensure_topics_patiently(settings, internal_topic_specs(wiring), wait_s=60)
        partition = partition_for(settings, run_id)
        async with HandLog(settings) as hand:
            where = await hand.log(old_log)
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")
        await producer.start()
        try:
            for seq, rec in enumerate(old_log):
                await producer.send_and_wait(
                    changelogs["index"], key=_json(f"{run_id}\x1f{rec['doc']['eventId']}"),
                    value=_json([seq, rec["hash"], partition, 1000 + seq]), partition=partition)
            await producer.send_and_wait(changelogs["heads"], key=_json(run_id),
                                         value=_json({"next": k, "hash": old_log[-1]["hash"]}), partition=partition)
            await producer.send_and_wait(changelogs["runs"], key=_json(run_id), value=_json(
                {"state": states[lag - 1][0], "next": lag, "head": old_log[lag - 1]["hash"], "since": lag}),
                partition=partition)
        finally:
            await producer.stop()
        assert where[-1][0] == partition

        worker = WorkerProcess(settings.replace(snapshot_every=1000)).start()
        try:
            summary = await publish_docs(settings, docs[k:], wire="avro")
            assert summary.accepted == len(docs) - k
            log = await wait_until(lambda: committed(settings, run_id, len(docs)), what="committed log",
                                   worker=worker, timeout=180)
        finally:
            worker.stop()
        assert [r.get("stateHash") for r in log[:k]] == [None] * k  # format 1, as the old version wrote them
        assert [r.get("stateHash") for r in log[k:]] == [h for _, h in states[k:]]
        assert not (await read_run(settings, run_id)).conflicts
        result = await replay_run(settings, run_id, from_seq=0)
        assert result.verdict == "match", result.first_divergence
        assert result.compared == len(docs) - k and result.undigested == k

    asyncio.run(scenario())
