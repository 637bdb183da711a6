"""A batch in progress at a rebalance is made durable before its partitions move, or writes no table.

Worker A (with ``slow_commit/sitecustomize.py`` on its path) handles the whole backlog as one batch,
sends its outputs, and holds that batch's commit until worker B joins the group and a rebalance
starts. Faust does not wait for our batches, so before ``agentlog.worker.fence`` A's table writes
landed whenever the batch finished — while B recovered the same tables — and a head could be
recovered ahead of its index (``test_many_workers``: hundreds of redelivered records refused as
``sequence_conflict``).

* ``wait``: the revocation waits for the batch (``fence.REVOKE_WAIT_S``), so its tables are in
  the changelogs before B reads them: every event is in the log exactly once (B and A see A's
  records as redeliveries) and nothing is fenced.
* ``no_wait`` (``fence.REVOKE_WAIT_S = 0``, the control): the batch is fenced, so it writes no table
  and the records are handled again by their owners: the log holds second, byte-identical copies
  of those events — proof the batch really was in progress across the rebalance — and still no
  event is refused and every run is whole.

``test_a_member_the_group_dropped_fences_at_once``: A is stopped (SIGSTOP) while it holds
the batch, for longer than its session, so the group drops it and gives B every partition; when A
goes on, aiokafka learns at its next heartbeat that it was dropped and rejoins. Waiting for the
batch then would only let its table writes land after B took the partitions over, so A fences it at
once. The control (``AGENTLOG_TEST_IGNORE_DROPPED=1``: the fence is not told) shows that write going
through: the batch is made durable although its partitions are B's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest

from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_topic
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import describe_group
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

_REPO = Path(__file__).resolve().parents[3]
_INJECT = Path(__file__).resolve().parent / "slow_commit"
RUNS = 24


async def _log(settings) -> list[tuple[str, int, bytes]]:
    out = []
    async for _, _, _, record in read_topic(settings, "log"):  # decoded CommittedEvents
        doc = record["doc"]
        out.append((doc["runId"], doc["sequence"], orjson.dumps(record, option=orjson.OPT_SORT_KEYS)))
    return out


async def _count(settings, short: str) -> int:
    return sum([1 async for _ in read_topic(settings, short)])


@pytest.mark.parametrize("revoke_wait_s", [5.0, 0.0], ids=["wait", "no_wait"])
def test_a_batch_in_progress_at_a_rebalance_is_durable_before_its_partitions_move_or_fenced(settings,
                                                                                            revoke_wait_s):
    # The Faust batch loop's fence (the transactional sequencer is fenced by the broker instead).
    settings = settings.replace(partitions=4, session_timeout_s=10.0, agent_runtime="faust")
    revoke_wait = {"agentlog.worker.fence:REVOKE_WAIT_S": revoke_wait_s}
    prefix = f"fence-{uuid.uuid4().hex[:6]}"
    docs = [doc for i in range(RUNS) for doc in llm_run(f"{prefix}-{i:02d}")]
    path = os.pathsep.join([str(_REPO), str(_INJECT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    async def scenario() -> None:
        await ensure_topics(settings)
        summary = await publish_docs(settings, docs)
        assert summary.accepted == len(docs)
        a = WorkerProcess(settings, log_name="fence-a", env={
            "PYTHONPATH": path, "AGENTLOG_TEST_HOLD_FIRST_COMMIT": "1"}, constants=revoke_wait).start()
        b = WorkerProcess(settings, log_name="fence-b", constants=revoke_wait)
        try:
            # A's first batch has sent its outputs (the log records) and holds its commit.
            await wait_until(lambda: _logged_at_least(settings, 1), what="A's first outputs", worker=a, timeout=90)
            # the log record can be read before A's injection has printed that it holds the commit
            await wait_until(lambda: _logged(a, "slow_commit: holding"), what="A holding its first commit",
                             worker=a, timeout=30)
            b.start()
            await wait_until(lambda: _whole(settings, len(docs)), what="every event in the log", worker=a,
                             timeout=120)
            # every event may be in the log (A's outputs) before B's join starts the rebalance A waits for
            await wait_until(lambda: _logged(a, "the first commit goes on"), what="A's held batch going on",
                             worker=a, timeout=60)
            if revoke_wait_s:
                await asyncio.sleep(3)  # anything handled twice would be in the log by now
            else:  # A's batch is fenced, so B handles its records again: wait for B's copies, bounded
                await wait_until(lambda: _twice(settings), what="B's copies of A's fenced batch", worker=b,
                                 timeout=90)
            assert a.alive() and b.alive()
        finally:
            b.stop()
            a.stop()
        log = await _log(settings)
        copies = Counter((run_id, seq) for run_id, seq, _ in log)
        assert set(copies) == {(d["runId"], d["sequence"]) for d in docs}
        by_key: dict[tuple[str, int], set[bytes]] = {}
        for run_id, seq, value in log:
            by_key.setdefault((run_id, seq), set()).add(value)
        assert all(len(values) == 1 for values in by_key.values()), "a second copy differs"
        assert await _count(settings, "rejections") == 0
        fenced = "not made durable" in a.log_path.read_text()
        twice = sum(1 for n in copies.values() if n > 1)
        if revoke_wait_s:
            assert not fenced
            assert twice == 0, f"{twice} events logged twice: A's batch was not durable before B recovered"
        else:
            assert fenced
            assert twice > 0

    asyncio.run(scenario())


async def _twice(settings) -> bool | None:
    """Whether some event is in the log twice."""
    copies = Counter((run_id, seq) for run_id, seq, _ in await _log(settings))
    return any(n > 1 for n in copies.values()) or None


async def _logged_at_least(settings, n: int) -> bool | None:
    return (await _count(settings, "log")) >= n or None


async def _whole(settings, n: int) -> bool | None:
    return len({(r, s) for r, s, _ in await _log(settings)}) >= n or None


@pytest.mark.parametrize("told", [True, False], ids=["dropped", "control"])
def test_a_member_the_group_dropped_fences_at_once(settings, told):
    # The Faust batch loop's fence (the transactional sequencer is fenced by the broker instead).
    settings = settings.replace(partitions=4, session_timeout_s=6.0, agent_runtime="faust")
    prefix = f"drop-{uuid.uuid4().hex[:6]}"
    docs = [doc for i in range(RUNS) for doc in llm_run(f"{prefix}-{i:02d}")]
    path = os.pathsep.join([str(_REPO), str(_INJECT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {"PYTHONPATH": path, "AGENTLOG_TEST_HOLD_FIRST_COMMIT": "1"}
    if not told:
        env["AGENTLOG_TEST_IGNORE_DROPPED"] = "1"

    async def scenario() -> None:
        await ensure_topics(settings)
        summary = await publish_docs(settings, docs)
        assert summary.accepted == len(docs)
        a = WorkerProcess(settings, log_name=f"drop-a-{'told' if told else 'control'}", env=env).start()
        b = WorkerProcess(settings, log_name=f"drop-b-{'told' if told else 'control'}")
        stopped = False
        try:
            await wait_until(lambda: _logged_at_least(settings, 1), what="A's first outputs", worker=a, timeout=90)
            # the log record can be read before A's injection has printed that it holds the commit
            await wait_until(lambda: _logged(a, "slow_commit: holding"), what="A holding its first commit",
                             worker=a, timeout=30)
            (a_member,) = await wait_until(lambda: _alone(settings), what="A alone in a stable group", worker=a,
                                           timeout=30)
            a.proc.send_signal(signal.SIGSTOP)
            stopped = True
            b.start()
            # B alone: the group waits for A no longer than its session, then gives B every partition.
            # Every event can be in the log (A's outputs) before that, so the log says nothing of it.
            await wait_until(lambda: _dropped(settings, a_member), what="the group to drop A", worker=b,
                             timeout=90)
            await wait_until(lambda: _whole(settings, len(docs)), what="every event in the log (B)", worker=b,
                             timeout=120)
            a.proc.send_signal(signal.SIGCONT)
            stopped = False
            await wait_until(lambda: _logged(a, "the first commit goes on"), what="A's held batch going on",
                             worker=a, timeout=60)
            await asyncio.sleep(3)
            assert a.alive() and b.alive()
        finally:
            if stopped:
                a.proc.send_signal(signal.SIGCONT)
            b.stop()
            a.stop()
        text = a.log_path.read_text()
        log = await _log(settings)
        assert {(r, s) for r, s, _ in log} == {(d["runId"], d["sequence"]) for d in docs}
        by_key: dict[tuple[str, int], set[bytes]] = {}
        for run_id, seq, value in log:
            by_key.setdefault((run_id, seq), set()).add(value)
        assert all(len(values) == 1 for values in by_key.values()), "a second copy differs"
        assert await _count(settings, "rejections") == 0
        fenced = "not made durable" in text
        if told:
            assert "the group dropped this worker" in text
            assert fenced, "A's batch was made durable after the group gave its partitions to B"
        else:
            assert "the group dropped this worker" not in text
            assert not fenced  # the control: the late table writes went through

    asyncio.run(scenario())


async def _group(settings) -> tuple[str, list[str]] | None:
    """The processing group's state and member ids, as the broker describes them (None: no such group yet)."""
    described = await describe_group(settings, f"{settings.topic_prefix}-worker")
    return None if described is None else (described[0], [member for member, _ in described[1]])


async def _alone(settings) -> list[str] | None:
    group = await _group(settings)
    return group[1] if group is not None and group[0] == "Stable" and len(group[1]) == 1 else None


async def _dropped(settings, member: str) -> bool | None:
    """Whether the group has settled without ``member``: one member left, another one, and stable."""
    group = await _group(settings)
    return (group is not None and group[0] == "Stable" and len(group[1]) == 1 and member not in group[1]) or None


async def _logged(worker: WorkerProcess, text: str) -> bool | None:
    return text in worker.log_path.read_text() or None
