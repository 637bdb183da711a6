"""Worker roles on a real broker: a ``process`` worker and a ``sink`` worker split the job.

The sink worker (a producer-only Faust app) must fill ClickHouse and answer queries without ever
joining the processing group, and a second sink on the same home must refuse at start, naming the owner.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.settings import settings_env
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import describe_group, free_port
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


async def _members(settings, group: str) -> int:
    described = await describe_group(settings, group)
    return 0 if described is None else len(described[1])


def test_a_process_worker_and_a_sink_worker_split_the_job(settings):
    settings = settings.replace(otlp_port=0)
    asyncio.run(ensure_topics(settings))
    run_id = f"roles-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    sink_settings = settings.replace(web_port=free_port())
    process = WorkerProcess(settings, role="process", log_name="roles-process").start()
    sink = WorkerProcess(sink_settings, role="sink", web=True, log_name="roles-sink").start()
    try:
        async def scenario():
            from agentlog.audit.store import read_owner

            async def owned():
                owner = read_owner(settings)
                return owner if owner and owner.get("queryUrl") else None

            owner = await wait_until(owned, timeout=120, what="the sink worker to own the store", worker=sink)
            assert owner["pid"] == sink.proc.pid and owner["role"] == "audit-sink"
            assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)

            env = {**os.environ, **settings_env(settings)}

            async def timeline():
                done = subprocess.run([sys.executable, "-m", "agentlog", "query", "run-timeline", "--param",
                                       f"run_id={run_id}", "--json"], env=env, capture_output=True, text=True,
                                      timeout=120)
                rows = json.loads(done.stdout)["rows"] if done.returncode == 0 else []
                return rows if len(rows) == len(docs) else None

            await wait_until(timeline, timeout=180, interval=2, what="the run in ClickHouse via the sink worker",
                             worker=process)
            # Only the process worker is in the processing groups; the sink never joined one.
            for agent in ("sequencer", "handoff", "otel-spans", "otel-sequencer"):
                assert await _members(settings, f"{settings.topic_prefix}-worker-{agent}") == 1
            assert await _members(settings, f"{settings.topic_prefix}.audit-sink") == 1

        asyncio.run(scenario())

        # A second sink on the same home: refused at start, at once, naming the owner.
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "agentlog", "worker", "--role", "sink", "--no-web"],
                                env={**os.environ, **settings_env(settings)}, capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert "error[store_locked]" in second.stderr and f"pid {sink.proc.pid}" in second.stderr
        assert time.monotonic() - t0 < 60  # not the minute a short-lived opener is waited for
        assert sink.alive() and process.alive()
    finally:
        sink.stop()
        process.stop()
