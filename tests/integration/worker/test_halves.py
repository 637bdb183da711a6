"""``agentlog worker --role all --sink-process``: the sink here, the Faust agents in a supervised child.

One real worker on real Kafka with the embedded store (:mod:`agentlog.worker.halves`):

* every event is in the log and in ClickHouse exactly once (``count()`` without FINAL), and the
  parent's ``/metrics`` carries the child's series (events accepted: the sequencer's, in the child)
  beside its own (the sink's);
* the child SIGKILLed mid-stream is started again (``agentlog_worker_child_restarts_total``) and
  what was published meanwhile still arrives exactly once;
* the parent SIGKILLed: its orphan child notices the closed pipe and stops, and a restarted worker
  takes the store at once (the parent held the store's lock, the child nothing).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
import uuid

import pytest

from agentlog.audit import query_via_worker
from agentlog.metrics import parse_exposition
from agentlog.schemas.errors import StoreError
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_topic
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import free_port_range
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        totals: dict[str, float] = {}
        for name, _, value in parse_exposition(answer.read().decode()):
            totals[name] = totals.get(name, 0.0) + value
        return totals


def test_an_all_worker_in_two_processes_stores_every_event_once_and_survives_either_half_dying(settings):
    # Two free ports below the ephemeral range: the child serves on the parent's port + 1.
    settings = settings.replace(partitions=4, session_timeout_s=6.0, web_port=free_port_range(2))
    prefix = f"halves-{uuid.uuid4().hex[:6]}"
    first = [doc for i in range(12) for doc in llm_run(f"{prefix}-a{i:02d}")]
    second = [doc for i in range(12) for doc in llm_run(f"{prefix}-b{i:02d}")]
    url = f"http://127.0.0.1:{settings.web_port}"

    async def count() -> int | None:
        answer = await asyncio.to_thread(query_via_worker, settings, {"sql": "SELECT count() FROM events"},
                                         worker_url=url, timeout_s=10)
        return int(answer["rows"][0][0]) if answer and "rows" in answer else None

    async def counted(n: int) -> bool | None:
        try:
            return (await count()) == n or None
        except StoreError:  # not serving yet
            return None

    async def scenario() -> None:
        await ensure_topics(settings)
        worker = WorkerProcess(settings, role="all", web=True, log_name="halves",
                               env={"AGENTLOG_SINK_PROCESS": "true"}).start()
        try:
            assert (await publish_docs(settings, first)).accepted == len(first)
            await wait_until(lambda: counted(len(first)), what="the first runs in ClickHouse", worker=worker,
                             timeout=180)
            [child] = _children(worker.proc.pid)
            # the sequencer runs in the child; its count reaches the parent's /metrics by the scrape
            await wait_until(lambda: _reached(settings.web_port, "agentlog_events_accepted_total", len(first)),
                             what="the child's series in the parent's /metrics", worker=worker, timeout=30)
            # the parent's own: the sink counts a batch's rows once its range is recorded, a moment after
            # ClickHouse can already count them
            await wait_until(lambda: _reached(settings.web_port, "agentlog_sink_rows_total", len(first)),
                             what="the parent's sink rows in its /metrics", worker=worker, timeout=30)

            os.kill(child, signal.SIGKILL)
            assert (await publish_docs(settings, second)).accepted == len(second)
            await wait_until(lambda: counted(len(first) + len(second)), what="every run after the child's SIGKILL",
                             worker=worker, timeout=180)
            [again] = _children(worker.proc.pid)
            assert again != child
            await wait_until(lambda: _reached(settings.web_port, "agentlog_worker_child_restarts_total", 1),
                             what="the restart counted", worker=worker, timeout=30)

            worker.kill()  # SIGKILL the parent: the orphan stops by itself
            deadline = time.monotonic() + 60
            while _alive(again) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert not _alive(again), "the process half outlived its parent"
            worker.start()  # the store's lock went with the parent: a new worker takes it at once
            await wait_until(lambda: counted(len(first) + len(second)), what="the restarted worker's store",
                             worker=worker, timeout=120)
        finally:
            worker.stop()
        assert "store_locked" not in worker.log_path.read_text()
        logged = {(r["doc"]["runId"], r["doc"]["sequence"]) async for *_, r in read_topic(settings, "log")}
        assert logged == {(d["runId"], d["sequence"]) for d in first + second}

    asyncio.run(scenario())


async def _reached(port: int, name: str, n: float) -> bool | None:
    try:
        return (await asyncio.to_thread(_metrics, port)).get(name, 0.0) >= n or None
    except OSError:
        return None
