"""Suites of pydantic-ai, OpenAI Agents SDK and LangGraph runs through the store: ``agentlog replay-suite``.

Per framework, five runs of its support desk program (:mod:`tests.unit.replay.suite_desk_pydantic_ai`,
``…_openai_agents``, ``…_langgraph``) are recorded with varied inputs and published through the SDK to a real
worker (Kafka, chdb audit store); ``agentlog suite create`` selects them (the last hour, by binding);
``agentlog replay-suite`` replays them from the store: the unchanged program matches all five (JUnit written, the
replays published and judged by the worker as matches), the changed routing diverges exactly the two refunds it
sends elsewhere, in one group where the routing shows (:data:`tests.unit.replay.test_suite_frameworks.ROUTING_SHOWS`).
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from agentlog.replay.regression import record
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, free_port
from tests.unit.replay import desk
from tests.unit.replay.test_suite_frameworks import FRAMEWORKS, ROUTING_SHOWS

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

#: Inputs 0, 1, 12, 13 and 15 of the desk's script: refunds of orders 100, 112 and 115, of which the changed
#: routing sends 112 and 115 to the escalation agent.
PICKED = (0, 1, 12, 13, 15)
REROUTED = (12, 15)


@pytest.fixture(scope="module")
def store(kafka_bootstrap, tmp_path_factory):
    """One worker with the audit sink and the web server for the three frameworks' suites."""
    from agentlog.streams.settings import load_settings

    home = tmp_path_factory.mktemp("suite-frameworks")
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}", home=home,
                             clickhouse_url=f"chdb://{home / 'ch'}", replication_factor=1, partitions=2,
                             web_port=free_port())
    asyncio.run(ensure_topics(settings))
    worker = WorkerProcess(settings, sink=True, web=True).start()
    yield worker
    worker.stop()


def _json(done) -> dict:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_suite_of_the_frameworks_runs_replays_from_the_store(name, store, tmp_path):
    pytest.importorskip(FRAMEWORKS[name])
    junitparser = pytest.importorskip("junitparser")
    from importlib import import_module

    program = f"tests.unit.replay.suite_desk_{name}"
    settings, tag = store.settings, uuid.uuid4().hex[:8]
    inputs = desk.inputs(max(PICKED) + 1)
    runs = {f"desk-{tag}-{i}": record(import_module(program).desk, run_id=f"desk-{tag}-{i}", input=inputs[i],
                                      bindings={"configVersion": f"desk-{tag}"}) for i in PICKED}

    async def published() -> None:
        docs = [d for run in runs.values() for d in run]
        assert (await publish_docs(settings, docs)).accepted == len(docs)

        async def stored() -> bool | None:
            done = agentlog_cli(settings, "sql", f"SELECT count(DISTINCT run_id) FROM events WHERE run_id LIKE "
                                                 f"'desk-{tag}-%' AND type = 'run.completed'", "--json")
            return True if done.returncode == 0 and _json(done)["rows"] == [[len(PICKED)]] else None

        await wait_until(stored, timeout=180, what="the runs in the audit store", worker=store)

    asyncio.run(published())
    suite_file = tmp_path / "desk.json"
    made = agentlog_cli(settings, "suite", "create", f"desk-{name}-{tag}", "--since", "1h", "--binding",
                        f"configVersion=desk-{tag}", "--node", desk.TRIAGE, "--out", str(suite_file), "--json")
    assert made.returncode == 0, made.stderr
    frozen = _json(made)
    assert [r["runId"] for r in frozen["runs"]] == list(runs)
    assert frozen["selection"]["since"].endswith("Z")  # the window as a time, not as "1h"

    junit = tmp_path / "junit.xml"
    same = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{program}:desk", "--jobs", "2",
                        "--json", "--junit", str(junit), "--code-version", "same", timeout=300)
    assert same.returncode == 0, same.stdout + same.stderr
    first = _json(same)
    assert first["counts"] == {"match": len(PICKED)} and first["published"] > 0
    [cases] = list(junitparser.JUnitXml.fromfile(str(junit)))
    assert (cases.tests, cases.failures, cases.errors, cases.skipped) == (len(PICKED), 0, 0, 0)

    routed = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{program}:desk_routing_v2",
                          "--no-publish", "--json", timeout=300)
    assert routed.returncode == 1, routed.stdout + routed.stderr
    report = _json(routed)
    assert report["counts"] == {"diverged": len(REROUTED), "match": len(PICKED) - len(REROUTED)}
    [group] = report["groups"]
    assert sorted(group["runs"]) == [f"desk-{tag}-{i}" for i in REROUTED]
    kind, event_type, node, path, at = ROUTING_SHOWS[name]
    assert (group["kind"], group["eventType"], group["nodeId"], group["path"]) == (kind, event_type, node, path)
    assert group["example"]["firstDivergence"]["atSequence"] == at

    async def judged() -> list | None:  # the worker judged the published replays as this run did
        done = agentlog_cli(settings, "query", "suite-executions", "--param", f"suite=desk-{name}-{tag}", "--json")
        rows = _json(done)["rows"] if done.returncode == 0 else []
        return rows if rows and rows[0][-1] == 0 else None

    [execution] = asyncio.run(wait_until(judged, timeout=180, what="the execution judged", worker=store))
    # suite, execution, started_at, code_version, runs, matched, diverged, what_if, pending
    assert (execution[1], execution[3], execution[4], execution[5], execution[6]) == (
        first["execution"], "same", len(PICKED), len(PICKED), 0)
