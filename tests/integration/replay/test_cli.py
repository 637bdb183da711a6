"""``agentlog replay`` and ``agentlog replay-verdicts`` as a user runs them: a subprocess on a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agentlog.streams.settings import Settings, settings_env
from tests.integration.replay.helpers import HandLog, chained
from tests.unit.replay.runs import llm_run

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[3]


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    return subprocess.run([sys.executable, "-m", "agentlog", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def _write(settings: Settings, docs: list[dict], records: list[dict], snapshot_at=()) -> list[tuple[int, int]]:
    async def go():
        async with HandLog(settings) as hand:
            where = await hand.log(records)
            await hand.snapshots(docs, dict(enumerate(where)), at=snapshot_at)
            return where

    return asyncio.run(go())


def test_replay_cli_exit_codes_json_and_report(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    where = _write(settings, docs, chained(docs), snapshot_at=(9, len(docs) - 1))

    ok = cli(settings, "replay", "--run", run_id, "--from-offset", str(where[15][1]), "--json")
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert (body["verdict"], body["fromSeq"], body["snapshotUsed"]) == ("match", 15, 9)
    assert body["compared"] == len(docs) - 10 and body["firstDivergence"] is None

    human = cli(settings, "replay", "--run", run_id, "--from-seq", "15")
    assert human.returncode == 0, human.stderr
    assert "match" in human.stdout and "snapshot at sequence 9" in human.stdout

    missing = cli(settings, "replay", "--run", "no-such-run", "--json")
    assert missing.returncode == 2
    assert json.loads(missing.stdout)["error"]["code"] == "replay_error"

    both = cli(settings, "replay", "--run", run_id, "--from-seq", "1", "--from-offset", "1")
    assert both.returncode == 2 and "error[replay_error]" in both.stderr


def test_replay_cli_reports_tampering_with_a_diff(settings):
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    docs = llm_run(run_id)
    records = chained(docs)
    records[1]["doc"]["payload"]["value"] = "summarise nothing"
    _write(settings, docs, records)

    out = cli(settings, "replay", "--run", run_id, "--from-seq", "0", "--json", "--all")
    assert out.returncode == 1, out.stderr
    body = json.loads(out.stdout)
    assert body["verdict"] == "diverged"
    assert (body["firstDivergence"]["atSequence"], body["firstDivergence"]["kind"]) == (1, "tampered")
    assert body["divergences"][0] == body["firstDivergence"]

    human = cli(settings, "replay", "--run", run_id)
    assert human.returncode == 1
    assert "tampered" in human.stdout and "sequence 1" in human.stdout and "recorded" in human.stdout


def test_replay_verdicts_cli_reads_the_verdicts_topic(settings):
    record = {"replayRunId": "r-prime", "sourceRunId": "r", "mode": "live", "verdict": "diverged",
              "errorCode": "replay_diverged", "events": [], "comparedThrough": 9,
              "firstDivergence": {"atSequence": 9, "kind": "output", "originalEventId": "e9",
                                  "path": "payload.result.hits", "expected": 3, "actual": 4}}

    async def go():
        async with HandLog(settings) as hand:
            await hand.send("verdicts", "r-prime", record)

    asyncio.run(go())
    out = cli(settings, "replay-verdicts", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [record]
    human = cli(settings, "replay-verdicts", "--run", "r-prime")
    assert "r-prime" in human.stdout and "diverged" in human.stdout
    none = cli(settings, "replay-verdicts", "--run", "other", "--json")
    assert json.loads(none.stdout) == []
