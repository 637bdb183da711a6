"""The whole worker with its audit sink: log → ClickHouse (chdb owned by the worker), queries
answered by the worker's HTTP endpoint, Prometheus metrics at /metrics.

The CLI runs in a separate process, as a user's would: it cannot open the chdb
directory the worker owns, so it must find the worker through the owner file.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid

import pytest

from streams.admin import ensure_topics
from streams.publisher import publish_docs
from streams.settings import settings_env
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    return subprocess.run([sys.executable, "-m", "processors", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_sink_fills_clickhouse_and_the_worker_answers_queries(settings):
    settings = settings.replace(web_port=_free_port(), web_enabled=True, sink_flush_s=0.3)
    asyncio.run(ensure_topics(settings))
    run_id = f"sink-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    worker = WorkerProcess(settings, sink=True, web=True).start()
    try:
        async def scenario():
            from processors.audit.store import read_owner

            async def owned():
                owner = read_owner(settings)
                return owner if owner and owner.get("queryUrl") else None

            await wait_until(owned, timeout=120, what="the worker to own the store", worker=worker)
            summary = await publish_docs(settings, docs, wire="avro")
            assert summary.accepted == len(docs)

            async def timeline():
                done = _cli(settings, "query", "run-timeline", "--param", f"run_id={run_id}", "--json")
                if done.returncode != 0:
                    return None
                rows = json.loads(done.stdout)["rows"]
                return rows if len(rows) == len(docs) else None

            rows = await wait_until(timeline, timeout=180, interval=2, what="run-timeline via the worker",
                                    worker=worker)
            columns = json.loads(_cli(settings, "query", "run-timeline", "--param", f"run_id={run_id}",
                                      "--json").stdout)["columns"]
            seq_col, type_col = columns.index("sequence"), columns.index("type")
            assert [r[seq_col] for r in rows] == list(range(len(docs)))
            assert [r[type_col] for r in rows] == [d["type"] for d in docs]

            refused = _cli(settings, "sql", "DROP TABLE events")
            assert refused.returncode == 2 and "read_only" in refused.stderr

            with urllib.request.urlopen(f"http://127.0.0.1:{settings.web_port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            accepted = [line for line in text.splitlines() if line.startswith("agentlog_events_accepted_total")]
            assert accepted and float(accepted[0].split()[-1]) >= len(docs)
            assert "agentlog_sink_rows_total{table=\"log\"}" in text

        asyncio.run(scenario())
    finally:
        worker.stop()
