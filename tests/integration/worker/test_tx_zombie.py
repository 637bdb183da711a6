"""A sequencer stopped mid-transaction past its session (a zombie) can write nothing once its partitions move.

Worker A (with ``hold_tx/sitecustomize.py`` on its path) sends its first batch's outputs into an open transaction
and is SIGSTOPped there, for longer than its session. The group gives B every ingest partition; B opening each
partition's writer fences A's transactional ids and aborts A's open transaction, then B handles every event.
A goes on (SIGCONT): its commit is refused by the broker. Read committed, the log holds every event exactly once,
nothing is rejected, and A's log says its batch was fenced.

``test_a_batch_in_progress_at_a_rebalance_commits_before_its_partitions_move``: A holds its first transaction open
a few seconds without being stopped while B joins the agents' groups, which starts a rebalance. A's runtime lets
the group move on only once the batch in progress has ended (:meth:`agentlog.worker.txruntime.TxAgent.revoked`
waits for it), so the batch commits, B takes its partitions from the position it committed, and the log holds
every event exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_topic
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

_REPO = Path(__file__).resolve().parents[3]
_INJECT = Path(__file__).resolve().parent / "hold_tx"
RUNS = 12


async def _log(settings) -> list[tuple[str, int]]:
    return [(r["doc"]["runId"], r["doc"]["sequence"]) async for _, _, _, r in read_topic(settings, "log")]


async def _whole(settings, n: int) -> bool | None:
    return len(set(await _log(settings))) >= n or None


async def _said(worker: WorkerProcess, text: str) -> bool | None:
    return text in worker.log_path.read_text() or None


def _held_first(name: str, hold_s: int) -> tuple[list[dict], dict[str, str]]:
    """The docs of ``RUNS`` runs, and the environment of a worker that holds its first transaction ``hold_s`` s."""
    prefix = f"{name}-{uuid.uuid4().hex[:6]}"
    docs = [doc for i in range(RUNS) for doc in llm_run(f"{prefix}-{i:02d}")]
    path = os.pathsep.join([str(_REPO), str(_INJECT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return docs, {"PYTHONPATH": path, "AGENTLOG_TEST_HOLD_FIRST_TX": "1", "AGENTLOG_TEST_HOLD_FIRST_TX_S": str(hold_s)}


def test_a_zombie_sequencer_is_fenced_and_its_open_transaction_never_read(settings):
    settings = settings.replace(partitions=4, session_timeout_s=6.0)
    docs, env = _held_first("zombie", 3)

    async def scenario() -> None:
        await ensure_topics(settings)
        assert (await publish_docs(settings, docs)).accepted == len(docs)
        a = WorkerProcess(settings, log_name="zombie-a", env=env).start()
        b = WorkerProcess(settings, log_name="zombie-b")
        stopped = False
        try:
            await wait_until(lambda: _said(a, "hold_tx: holding"), what="A holding its first transaction",
                             worker=a, timeout=90)
            a.proc.send_signal(signal.SIGSTOP)
            stopped = True
            b.start()
            await wait_until(lambda: _whole(settings, len(docs)), what="every event in the log (B)", worker=b,
                             timeout=150)
            a.proc.send_signal(signal.SIGCONT)
            stopped = False
            await wait_until(lambda: _said(a, "a batch was fenced"), what="A's held batch refused", timeout=60)
        finally:
            if stopped:
                a.proc.send_signal(signal.SIGCONT)
            b.stop()
            a.stop()
        log = await _log(settings)
        assert sorted(log) == sorted((d["runId"], d["sequence"]) for d in docs)  # each exactly once
        assert not [k for k, n in Counter(log).items() if n > 1]
        assert [r async for r in read_topic(settings, "rejections")] == []

    asyncio.run(scenario())


def test_a_batch_in_progress_at_a_rebalance_commits_before_its_partitions_move(settings):
    settings = settings.replace(partitions=4, session_timeout_s=10.0)
    docs, env = _held_first("rebalance", 6)

    async def scenario() -> None:
        await ensure_topics(settings)
        assert (await publish_docs(settings, docs)).accepted == len(docs)
        a = WorkerProcess(settings, log_name="fence-a", env=env).start()
        b = WorkerProcess(settings, log_name="fence-b")
        try:
            await wait_until(lambda: _said(a, "hold_tx: holding"), what="A holding its first transaction",
                             worker=a, timeout=90)
            b.start()  # joins while A's batch is open: the rebalance waits for it
            await wait_until(lambda: _said(a, "hold_tx: the first transaction goes on"), what="A's batch going on",
                             worker=a, timeout=60)
            await wait_until(lambda: _whole(settings, len(docs)), what="every event in the log", worker=b,
                             timeout=150)
            await asyncio.sleep(3)  # anything handled twice would be in the log by now
            assert a.alive() and b.alive()
        finally:
            b.stop()
            a.stop()
        assert not await _said(a, "a batch was fenced")  # the batch ended before its partitions moved
        log = await _log(settings)
        assert sorted(set(log)) == sorted((d["runId"], d["sequence"]) for d in docs)
        assert not [k for k, n in Counter(log).items() if n > 1]
        assert [r async for r in read_topic(settings, "rejections")] == []

    asyncio.run(scenario())
