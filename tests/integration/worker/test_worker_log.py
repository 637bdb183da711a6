"""A real worker's log through a healthy start and a run: no errors, no terminal escapes; JSON lines on request.

The worker writes to a file (as ``agentlog demo``'s worker and any service manager's do), so its
stderr is not a terminal: the text log is plain. ``AGENTLOG_LOG_FORMAT=json`` (the setting behind
``--log-format``, which a child started by ``WorkerProcess`` takes from the settings) makes every
line a JSON object, the lines written before Faust starts included.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from agentlog.audit.store import read_owner
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from agentlog.streams.reader import read_run
from agentlog.streams.settings import Settings
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import free_port
from tests.unit.core.runs import realistic_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

#: The lines ``WorkerProcess`` itself writes into the log before each start.
HARNESS_MARK = "===== start #"


def _healthy_run(settings: Settings, log_name: str) -> list[str]:
    """Start a worker (agents and sink), sequence one run through it, stop it; its log's lines."""
    settings = settings.replace(web_port=free_port())
    asyncio.run(ensure_topics(settings))
    run_id = f"log-{uuid.uuid4().hex[:8]}"
    docs = realistic_run(run_id, mode="check")
    worker = WorkerProcess(settings, sink=True, web=True, log_name=log_name).start()
    try:
        async def scenario() -> None:
            async def owned():
                owner = read_owner(settings)
                return owner if owner and owner.get("queryUrl") else None

            await wait_until(owned, timeout=120, what="the worker to own the store", worker=worker)
            assert (await publish_docs(settings, docs, wire="avro")).accepted == len(docs)

            async def sequenced():
                return len(await read_run(settings, run_id)) == len(docs)

            await wait_until(sequenced, timeout=180, interval=1, what="the run in the log", worker=worker)

        asyncio.run(scenario())
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()
    return [line for line in worker.log_path.read_text().splitlines()
            if line.strip() and not line.startswith(HARNESS_MARK)]


def test_a_healthy_worker_writes_a_plain_log_without_errors(settings: Settings) -> None:
    lines = _healthy_run(settings, "text-worker")
    text = "\n".join(lines)
    assert "\x1b[" not in text and "\b" not in text, repr(text[:2000])
    assert not [line for line in lines if "ERROR" in line or "CRITICAL" in line], text
    # the log is there, in the text form: the signing key the worker made at its first start
    assert any("[WARNING] agentlog.signing: created the checkpoint signing key" in line for line in lines), text


def test_a_json_log_is_one_object_per_line(settings: Settings) -> None:
    lines = _healthy_run(settings.replace(log_format="json"), "json-worker")
    records = [json.loads(line) for line in lines]
    assert records and all({"time", "level", "logger", "message", "pid"} <= r.keys() for r in records), lines
    assert not [r for r in records if r["level"] in ("ERROR", "CRITICAL")], lines
    # written before Faust starts, by the worker's own setup
    assert any(r["logger"] == "agentlog.signing" and r["message"].startswith("created the checkpoint signing key")
               for r in records), lines
