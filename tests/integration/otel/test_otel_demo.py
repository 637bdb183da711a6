"""``agentlog demo --otel`` on the real broker: the same story through the demo's own path.

The demo's summary is checked against the spans' attributes and the audit history it queried,
and the CLI entry point is run once with ``--json`` as a user would, with ``AGENTLOG_WEB_TOKEN`` set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentlog.demo.tour import stop_worker
from agentlog.streams.settings import settings_env
from tests.tools import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]


def test_demo_otelagentlog_cli(settings):
    # With a web token: the demo's exporter sends it, as the receiver then asks of every export.
    demo = settings.replace(web_port=free_port(), otlp_port=free_port(), web_token="demo-t0ken")
    env = {**os.environ, **settings_env(demo), "PYTHONPATH": str(REPO)}
    try:
        out = subprocess.run([sys.executable, "-m", "agentlog", "demo", "--otel", "--json"], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=500)
    finally:
        stop_worker(demo)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    runs = summary["runs"]
    assert set(runs) == {"planner", "researcher"}
    assert runs["planner"]["runId"] != runs["researcher"]["runId"]
    assert runs["planner"]["types"][0] == "run.started" and runs["planner"]["types"][-1] == "run.completed"
    assert runs["planner"]["types"].count("agent.toolCalled") == 1
    assert sorted(t[0] for t in summary["transitions"]) == ["child.completed", "dispatch.began", "dispatch.succeeded"]
    assert {t[2] for t in summary["transitions"] if t[0] != "dispatch.began"} == {runs["researcher"]["runId"]}
    assert [summary["usage"]["input_tokens"], summary["usage"]["output_tokens"]] == summary["expected_tokens"]
    assert summary["expected_tokens"][0] > 0
