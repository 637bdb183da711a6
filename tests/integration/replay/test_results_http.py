"""Recorded results over HTTP, driven by ``curl`` (a client that is not Python).

A recorded run's committed log is written to the real broker; a real worker serves its results
on its Faust web server. ``curl`` asks for an LLM result (hit), for a changed request (miss, with
the nearest recorded call and the field that made the key differ) and for a tool result by tool
name and arguments digest. The expected values come from the recorded run (``runs.llm_run``),
the Python side only builds URLs and reads curl's output.
"""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import subprocess
import uuid

import pytest

from agentlog.core.result_cache import args_digest
from agentlog.schemas.canonical import jcs, sha256_hex
from tests.integration.replay.helpers import HandLog, chained
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import free_port
from tests.unit.replay.runs import ENVELOPE, REQUEST, TOOL_ARGS, TOOL_RESULT, llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]

LLM_KEY = sha256_hex(jcs(REQUEST))  # the key llm_run records


def curl(*args: str) -> tuple[int, dict]:
    """HTTP status and JSON body of one curl call."""
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}", *args],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    body, _, status = out.rpartition("\n")
    return int(status), json.loads(body)


def test_a_non_python_host_gets_recorded_results_and_miss_diagnoses(settings) -> None:
    settings = settings.replace(web_port=free_port())
    run_id = f"rec-{uuid.uuid4().hex[:8]}"
    base = f"http://127.0.0.1:{settings.web_port}/replay/{run_id}/results"

    async def write() -> None:
        async with HandLog(settings) as hand:
            await hand.log(chained(llm_run(run_id)))

    asyncio.run(write())
    worker = WorkerProcess(settings, web=True).start()
    try:
        async def serving() -> bool | None:
            try:
                return curl(f"http://127.0.0.1:{settings.web_port}/health")[0] == 200 or None
            except subprocess.CalledProcessError:
                return None

        asyncio.run(wait_until(serving, timeout=180, what="the worker's web server", worker=worker))

        status, body = curl(f"{base}?node=planner&attempt=0&cacheKey={LLM_KEY}")
        assert status == 200, body
        assert body["result"]["kind"] == "valid" and body["result"]["envelope"] == ENVELOPE

        asked = copy.deepcopy(REQUEST)
        asked["temperature"] = 0.7
        status, body = curl("-X", "POST", "-H", "Content-Type: application/json", "--data",
                            json.dumps({"node": "planner", "attempt": 0, "request": asked}), base)
        assert status == 404 and body["error"]["code"] == "replay_cache_miss"
        assert body["diagnosis"]["nearest"]["cacheKey"] == LLM_KEY
        assert [(d["path"].rsplit(".", 1)[-1], d["recorded"], d["requested"]) for d in body["diagnosis"]["diff"]] \
            == [("temperature", 0, 0.7)]

        status, body = curl(f"{base}?node=planner&attempt=0&cacheKey={'0' * 64}")
        assert status == 404 and body["diagnosis"]["nearest"]["cacheKey"] == LLM_KEY

        status, body = curl(f"{base}?node=research&attempt=1&tool=search&argsDigest={args_digest(TOOL_ARGS)}")
        assert status == 200, body
        assert body["result"] == {"kind": "tool", "tool": "search", "result": TOOL_RESULT}

        status, body = curl(f"http://127.0.0.1:{settings.web_port}/replay/no-such-{run_id}/results?cacheKey=x")
        assert status == 404 and body["error"]["code"] == "replay_source_missing"
    finally:
        worker.stop()
