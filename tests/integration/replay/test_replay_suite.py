"""A suite of production runs on a real broker, worker and chdb: select by query, freeze, replay, erase one.

Nine runs of the pydantic-ai support program (:mod:`tests.unit.replay.suite_program`) are recorded with varied
inputs and published through the SDK, six bound to ``configVersion`` v1 and three to v2. ``agentlog suite create``
selects from the audit store (through the worker that owns it) by binding, node and status, and by seeded sample;
``agentlog replay-suite`` replays the frozen runs from the store and publishes the replays, which the worker judges:
the executions and their verdicts are history (named queries, console pages); after ``agentlog erase`` of one of
them the suite reports that run erased and replays the rest.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from agentlog.streams.publisher import publish_docs
from tests.integration.worker.worker_proc import wait_until
from tests.tools import agentlog_cli, http_get

pytest.importorskip("pydantic_ai")

from agentlog.replay.regression import record  # noqa: E402
from tests.unit.replay import suite_program  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

PROGRAM = "tests.unit.replay.suite_program"






def _json(done) -> dict:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_suite_selected_from_the_store_replays_and_reports_an_erased_run(web_worker, tmp_path):
    worker = web_worker
    settings = worker.settings
    tag = uuid.uuid4().hex[:8]
    runs = {}
    for i, asked in enumerate(suite_program.inputs(9)):
        version = "v1" if i < 6 else "v2"
        runs[f"suite-{tag}-{i}"] = record(suite_program.support, run_id=f"suite-{tag}-{i}", input=asked,
                                          bindings={"configVersion": f"{version}-{tag}"})

    async def published() -> None:
        docs = [d for run in runs.values() for d in run]
        assert (await publish_docs(settings, docs)).accepted == len(docs)

        async def stored() -> bool | None:
            done = agentlog_cli(settings, "sql", f"SELECT count(DISTINCT run_id) FROM events WHERE run_id LIKE "
                                                 f"'suite-{tag}-%' AND type = 'run.completed'", "--json")
            return True if done.returncode == 0 and _json(done)["rows"] == [[9]] else None

        await wait_until(stored, timeout=180, what="the nine runs in the audit store", worker=worker)

    asyncio.run(published())

    suite_file = tmp_path / "v1.json"
    made = agentlog_cli(settings, "suite", "create", f"v1-{tag}", "--binding", f"configVersion=v1-{tag}", "--node",
                        "planner", "--status", "completed", "--out", str(suite_file), "--json")
    assert made.returncode == 0, made.stderr
    frozen = _json(made)
    assert [r["runId"] for r in frozen["runs"]] == [f"suite-{tag}-{i}" for i in range(6)]
    assert all(len(r["head"]) == 64 and r["events"] == len(runs[r["runId"]]) for r in frozen["runs"])

    sampled = [agentlog_cli(settings, "suite", "create", "s", "--binding", f"configVersion=v1-{tag}", "--sample",
                            "3", "--seed", "7", "--out", str(tmp_path / f"s{k}.json"), "--json") for k in (1, 2)]
    picks = [[r["runId"] for r in _json(s)["runs"]] for s in sampled]
    assert len(picks[0]) == 3 and picks[0] == picks[1]

    replayed = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{PROGRAM}:support", "--jobs",
                            "2", "--json", "--junit", str(tmp_path / "junit.xml"), "--code-version", "abc123",
                            timeout=300)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    first = _json(replayed)
    assert first["counts"] == {"match": 6} and first["published"] > 0  # from the store: published by default

    changed = agentlog_cli(settings, "replay-suite", str(suite_file), "--program",
                           f"{PROGRAM}:support_refund_v2", "--json", "--code-version", "def456", timeout=300)
    assert changed.returncode == 1
    second = _json(changed)
    [group] = second["groups"]
    assert sorted(group["runs"]) == [f"suite-{tag}-{i}" for i in (0, 3)]  # the two v1 runs asking for a refund

    # The history: the worker judged every published replay; the executions and their runs are queryable.
    async def judged() -> list | None:
        done = agentlog_cli(settings, "query", "suite-executions", "--param", f"suite=v1-{tag}", "--json")
        rows = _json(done)["rows"] if done.returncode == 0 else []
        return rows if len(rows) == 2 and all(row[-1] == 0 for row in rows) else None

    executions = asyncio.run(wait_until(judged, timeout=180, what="both executions judged", worker=worker))
    # suite, execution, started_at, code_version, runs, matched, diverged, what_if, pending (newest first)
    assert [(r[1], r[3], r[4], r[5], r[6]) for r in executions] == [
        (second["execution"], "def456", 6, 4, 2), (first["execution"], "abc123", 6, 6, 0)]
    runs = _json(agentlog_cli(settings, "query", "suite-runs", "--param", f"execution={second['execution']}",
                              "--json"))["rows"]
    assert [(r[0], r[5]) for r in runs][:2] == [(f"suite-{tag}-0", "diverged"), (f"suite-{tag}-3", "diverged")]
    status, page = http_get(worker, f"/suites/{second['execution']}")
    assert status == 200 and f"suite-{tag}-3" in page and "/compare?a=" in page
    status, page = http_get(worker, f"/suites?suite=v1-{tag}")
    assert status == 200 and "def456" in page and "abc123" in page

    erased = f"suite-{tag}-1"
    done = agentlog_cli(settings, "erase", "--run", erased, "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    after = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{PROGRAM}:support", "--json",
                         timeout=300)
    assert after.returncode == 0, after.stdout + after.stderr
    body = _json(after)
    assert body["counts"] == {"erased": 1, "match": 5}
    assert [r["runId"] for r in body["notReplayed"]] == [erased]
