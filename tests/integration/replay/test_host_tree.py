"""Host-replay verdicts over run trees, read from a real broker's committed log.

The logs are the golden tree pairs (``tests/unit/replay/make_golden.py``), written to the log
topic as an honest worker would commit them; ``host_replay_verdict`` reads them back, follows the
dispatches into the child runs and waits (bounded) for replay children that have not ended.
Expected verdicts are the golden pairs' (written from how each pair was made).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaProducer

from agentlog.replay import host
from agentlog.replay.host import host_replay_verdict
from agentlog.streams.codec import encode_record
from agentlog.streams.security import client_kwargs
from agentlog.streams.topics import topic_name
from tests.integration.replay.helpers import HandLog, chained
from tests.unit.replay.make_golden import tree_pairs

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

PAIRS = tree_pairs()


async def _write(settings, *docs_lists: list[dict]) -> None:
    async with HandLog(settings) as hand:
        for docs in docs_lists:
            runs: dict[str, list[dict]] = defaultdict(list)
            for doc in docs:
                runs[doc["runId"]].append(doc)
            for run in runs.values():
                await hand.log(chained(run))


def _verdict(settings, name: str, *, drop_terminal_of: str | None = None) -> dict:
    original, replay = PAIRS[name]
    if drop_terminal_of is not None:
        replay = [d for d in replay if not (d["runId"] == drop_terminal_of and d["type"] == "run.completed")]
    asyncio.run(_write(settings, original, replay))
    request = {"replayRunId": replay[0]["runId"], "sourceRunId": original[0]["runId"], "mode": "live"}
    return asyncio.run(host_replay_verdict(settings, request))


def test_divergence_inside_a_child_run_reaches_the_parent_verdict(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 30.0)
    record = _verdict(settings, "child-diverged")
    assert record["verdict"] == "diverged" and record["firstDivergence"]["atSequence"] == 4
    assert [(hop["worker"], hop["sourceChildRunId"]) for hop in record["path"]] == [("worker-a", "par-3.child-a")]
    assert "detail" not in record


def test_refusal_inside_a_child_run(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 30.0)
    record = _verdict(settings, "child-refusal")
    assert (record["verdict"], record["errorCode"]) == ("diverged_at_refusal", "replay_diverged_at_refusal")
    assert record["path"][0]["worker"] == "worker-a"


def test_a_child_that_does_not_end_is_waited_for_only_so_long_and_the_verdict_says_so(settings, monkeypatch) -> None:
    # child-b of the faithful replay never reaches a terminal status: after the wait the verdict
    # compares what was committed (run.completed missing) and says it gave up.
    monkeypatch.setattr(host, "CHILD_WAIT_S", 1.0)
    record = _verdict(settings, "child-diverged",
                      drop_terminal_of="replay-par-3-fresh.child-b")
    assert "gave up waiting for replay child run replay-par-3-fresh.child-b" in record["detail"]


def test_interleaving_is_a_match_with_reordered_and_strict_keeps_index_semantics(settings, monkeypatch) -> None:
    monkeypatch.setattr(host, "CHILD_WAIT_S", 1.0)
    original, replay = PAIRS["interleaved"]
    asyncio.run(_write(settings, original, replay))
    request = {"replayRunId": replay[0]["runId"], "sourceRunId": original[0]["runId"], "mode": "live"}
    lanes = asyncio.run(host_replay_verdict(settings, request))
    assert lanes["verdict"] == "match" and len(lanes["reordered"]) == 6
    strict = asyncio.run(host_replay_verdict(settings, request, strict=True))
    assert strict["verdict"] == "diverged" and strict["firstDivergence"]["atSequence"] == 3
    assert "reordered" not in strict


def test_a_verdict_asked_at_the_commit_waits_for_the_transaction_markers(settings, monkeypatch) -> None:
    # The worker asks for a verdict once its transaction commits; the broker writes the commit markers after
    # that, and until then a read_committed read shows none of the transaction's records. The replay run's
    # log is held in a transaction that commits a second after the verdict was asked.
    monkeypatch.setattr(host, "CHILD_WAIT_S", 30.0)
    original, replay = PAIRS["child-diverged"]
    asyncio.run(_write(settings, original, [d for d in replay if d["runId"] != replay[0]["runId"]]))
    request = {"replayRunId": replay[0]["runId"], "sourceRunId": original[0]["runId"], "mode": "live"}

    async def asked_before_the_markers() -> dict:
        producer = AIOKafkaProducer(**client_kwargs(settings), transactional_id=f"hand-{uuid.uuid4().hex}")
        await producer.start()
        try:
            async with producer.transaction():
                for rec in chained([d for d in replay if d["runId"] == replay[0]["runId"]]):
                    await producer.send(topic_name(settings, "log"), encode_record(rec),
                                        key=rec["doc"]["runId"].encode())
                verdict = asyncio.create_task(host_replay_verdict(settings, request, ended=True))
                await asyncio.sleep(1.0)
            return await verdict
        finally:
            await producer.stop()

    record = asyncio.run(asked_before_the_markers())
    assert record["verdict"] == "diverged" and record["firstDivergence"]["atSequence"] == 4
