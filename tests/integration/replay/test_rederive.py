"""Re-derivation from an offset on the real broker (SPEC §7.1).

Two kinds of logs: ones a real ``agentlog worker`` built (each record carrying its state hash,
snapshots written beside them), and ones written by hand so that an altered record is the *first*
copy of its (runId, sequence) — the copy every reader keeps.
"""

from __future__ import annotations

import asyncio
import copy
import uuid

import pytest

from agentlog.metrics import METRICS
from agentlog.replay import Divergence, replay_run
from agentlog.schemas.canonical import chain_hash
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run
from tests.integration.replay.helpers import HandLog, chained, committed, logged, terminal_snapshot
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

SNAPSHOT_EVERY = 5


@pytest.fixture
def worker(settings):
    asyncio.run(ensure_topics(settings))
    proc = WorkerProcess(settings, constants={"agentlog.worker.sequencer:SNAPSHOT_EVERY": SNAPSHOT_EVERY}).start()
    yield proc
    proc.stop()


async def _publish_and_settle(settings, worker, docs):
    run_id = docs[0]["runId"]
    summary = await publish_docs(settings, docs, wire="avro")
    assert summary.accepted == len(docs) and not summary.rejected
    log = await wait_until(lambda: committed(settings, run_id, len(docs)), what="committed log", worker=worker)
    recorded = await wait_until(lambda: logged(settings, run_id, len(docs)), what="log records", worker=worker)
    snaps = await wait_until(lambda: terminal_snapshot(settings, run_id, len(docs) - 1),
                             what="terminal snapshot", worker=worker)
    return log, recorded, snaps


def test_worker_built_log_replays_to_match_from_any_start(settings, worker):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)

    async def scenario():
        log, recorded, snaps = await _publish_and_settle(settings, worker, docs)
        head = log[-1]["hash"]

        whole = await replay_run(settings, run_id, from_seq=0)
        assert whole.verdict == "match", whole.first_divergence
        assert whole.snapshot_used is None and whole.compared == len(docs)
        assert whole.head_hash == head and whole.last_sequence == len(docs) - 1

        middle = len(docs) // 2 + 1
        progress = []
        by_offset = await replay_run(settings, run_id, from_offset=recorded[middle]["logOffset"],
                                     progress=lambda done, total: progress.append((done, total)))
        expected_snapshot = max(s for s in snaps if s < middle)
        assert by_offset.verdict == "match", by_offset.first_divergence
        assert by_offset.from_seq == middle
        assert by_offset.snapshot_used == expected_snapshot
        assert by_offset.read_from_offset == recorded[expected_snapshot]["logOffset"] + 1
        assert by_offset.compared == len(docs) - expected_snapshot - 1
        assert by_offset.head_hash == head
        assert progress and progress[-1][0] == by_offset.compared

        early = await replay_run(settings, run_id, from_seq=min(snaps))  # no snapshot strictly before it
        assert early.verdict == "match" and early.snapshot_used is None and early.compared == len(docs)
        assert early.bindings == docs[0]["payload"]["bindings"]

    asyncio.run(scenario())


def test_rewritten_copy_appended_after_the_worker_stopped_is_tampered(settings, worker):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 10  # variable.changed searchHits

    async def scenario():
        log, recorded, _ = await _publish_and_settle(settings, worker, docs)
        worker.stop()
        forged = copy.deepcopy(log[k])
        forged["doc"]["payload"]["value"] = 999
        async with HandLog(settings) as hand:
            await hand.send("log", run_id, forged)
        assert (await read_run(settings, run_id)).conflicts  # the reader keeps the first copy and notes this one

        before = METRICS.get("replay_behavior_mismatch_total", aspect="chain")
        result = await replay_run(settings, run_id, from_seq=0)
        assert result.verdict == "diverged"
        d = result.first_divergence
        assert (d.at_sequence, d.kind) == (k, "tampered")
        assert (d.path, d.expected, d.actual) == ("doc.payload.value", 3, 999)
        assert d.log_offset > recorded[len(docs) - 1]["logOffset"]
        assert METRICS.get("replay_behavior_mismatch_total", aspect="chain") == before + 1

        # Started after k from a snapshot, the copy is still judged — against what its first copy carries.
        late = await replay_run(settings, run_id, from_seq=len(docs) - 2)
        assert late.snapshot_used is not None and late.snapshot_used > k
        assert (late.first_divergence.at_sequence, late.first_divergence.kind) == (k, "tampered")

    asyncio.run(scenario())


# --- hand-written logs: the altered record comes first ------------------------------------------------


def _altered(docs: list[dict], k: int, value) -> list[dict]:
    out = copy.deepcopy(docs)
    out[k]["payload"]["value"] = value
    return out


def test_first_copy_altered_is_tampered_at_its_index(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 10

    async def scenario():
        records = chained(docs)
        records[k]["doc"]["payload"]["value"] = 4  # hashes left as committed: the doc no longer matches them
        async with HandLog(settings) as hand:
            where = await hand.log(records)
        assert not (await read_run(settings, run_id)).conflicts  # nothing a dedup would notice

        result = await replay_run(settings, run_id, from_seq=0, collect_all=True)
        assert result.verdict == "diverged"
        d = result.first_divergence
        assert (d.at_sequence, d.kind, d.path) == (k, "tampered", "hash")
        assert d.actual == records[k]["hash"] and d.expected == chain_hash(records[k - 1]["hash"], records[k]["doc"])
        assert d.log_offset == where[k][1]
        assert isinstance(d, Divergence) and result.to_json_dict()["firstDivergence"] == {
            "atSequence": k, "kind": "tampered", "path": "hash", "expected": d.expected, "actual": records[k]["hash"],
            "logOffset": where[k][1],
            "detail": "hash does not match chain_hash(prevHash, doc): the doc was altered after it was committed"}
        # The altered value also changes the state from k on; collect-all reports that stretch once.
        assert [(x.at_sequence, x.kind) for x in result.divergences] == [(k, "tampered")]

    asyncio.run(scenario())


def test_consistently_rewritten_chain_is_caught_by_the_state_hashes_with_a_field_diff(settings):
    """A forger recomputes the chain over an altered doc but keeps the state hashes the worker committed.

    (A forger who recomputes those too, or whose change leaves the state alone, leaves a log that
    refolds to itself: the signed checkpoints catch that, ``agentlog verify``, tests/faults/test_tamper.py.)
    """
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 10

    async def scenario():
        forged = _altered(docs, k, 7)
        async with HandLog(settings) as hand:
            where = await hand.log(chained(forged, recorded=docs))  # a self-consistent chain over the forged docs
            await hand.snapshots(docs, dict(enumerate(where)), at=(4, k, len(docs) - 1))
        result = await replay_run(settings, run_id, from_seq=0)
        d = result.first_divergence
        assert (d.at_sequence, d.kind) == (k, "state")
        assert (d.path, d.expected, d.actual) == ("state.variables.searchHits", 3, 7)

    asyncio.run(scenario())


def test_missing_records_are_reported(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    k = 6

    async def scenario():
        records = chained(docs)
        async with HandLog(settings) as hand:
            await hand.log(records[:k] + records[k + 1:])  # a hole at k
        result = await replay_run(settings, run_id, from_seq=0, collect_all=True)
        assert [(d.at_sequence, d.kind) for d in result.divergences] == [(k, "missing")]
        assert result.verdict == "diverged"

    asyncio.run(scenario())


def test_unknown_run_is_an_error_not_a_match(settings):
    async def scenario():
        await ensure_topics(settings)
        return await replay_run(settings, "no-such-run", from_seq=0)

    result = asyncio.run(scenario())
    assert result.verdict == "error" and result.error["code"] == "replay_error"
