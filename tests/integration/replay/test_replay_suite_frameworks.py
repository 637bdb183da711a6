"""Suites of pydantic-ai, OpenAI Agents SDK and LangGraph runs through the store: ``agentlog replay-suite``.

Per framework, five runs of its support desk program (:mod:`tests.unit.replay.suite_desk_pydantic_ai`,
``…_openai_agents``, ``…_langgraph``) are recorded with varied inputs and published through the SDK to a real
worker (Kafka, chdb audit store); ``agentlog suite create`` selects them (the last hour, by binding);
``agentlog replay-suite`` replays them from the store and publishes the replays: the unchanged program matches all
five (JUnit written), the changed routing diverges exactly the two refunds it sends elsewhere, in one group where
the routing shows (:data:`tests.unit.replay.test_suite_frameworks.ROUTING_SHOWS`). The worker judges every
published replay as the command did, and the console's suite pages show both executions in a real Chromium.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from subprocess import CompletedProcess
from urllib.parse import quote, urlencode

import pytest

from agentlog.replay.regression import record
from agentlog.streams.admin import ensure_topics
from agentlog.streams.publisher import publish_docs
from tests.integration.worker.worker_proc import WorkerProcess, wait_until
from tests.tools import agentlog_cli, free_port, require_tool
from tests.unit.audit.pngcheck import distinct_colours
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


@dataclass(frozen=True)
class Executed:
    """One framework's suite: what ``suite create`` and the two ``replay-suite`` runs printed, once judged."""

    name: str
    suite: str
    runs: tuple[str, ...]
    made: CompletedProcess[str]
    same: CompletedProcess[str]
    routed: CompletedProcess[str]
    junit: Path
    executions: list[list]  # suite-executions rows, newest first


def _json(done: CompletedProcess[str]) -> dict:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def executed(request: pytest.FixtureRequest, store, tmp_path_factory) -> Executed:
    name = request.param
    pytest.importorskip(FRAMEWORKS[name])
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
    out = tmp_path_factory.mktemp(f"suite-{name}")
    suite_file, junit, suite = out / "desk.json", out / "junit.xml", f"desk-{name}-{tag}"
    made = agentlog_cli(settings, "suite", "create", suite, "--since", "1h", "--binding", f"configVersion=desk-{tag}",
                        "--node", desk.TRIAGE, "--out", str(suite_file), "--json")
    same = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{program}:desk", "--jobs", "2",
                        "--json", "--junit", str(junit), "--code-version", "same", timeout=300)
    routed = agentlog_cli(settings, "replay-suite", str(suite_file), "--program", f"{program}:desk_routing_v2",
                          "--json", "--code-version", "routing-v2", timeout=300)

    async def judged() -> list | None:  # both executions, every replay judged by the worker
        done = agentlog_cli(settings, "query", "suite-executions", "--param", f"suite={suite}", "--json")
        rows = _json(done)["rows"] if done.returncode == 0 else []
        return rows if len(rows) == 2 and all(row[-1] == 0 for row in rows) else None

    executions = asyncio.run(wait_until(judged, timeout=180, what="both executions judged", worker=store)) \
        if made.returncode == same.returncode == 0 and routed.returncode == 1 else []
    return Executed(name, suite, tuple(runs), made, same, routed, junit, executions)


def test_replay_suite_matches_the_unchanged_program_and_groups_the_rerouted_runs(executed: Executed):
    junitparser = pytest.importorskip("junitparser")
    tag = executed.runs[0].rsplit("-", 1)[0]
    assert executed.made.returncode == 0, executed.made.stderr
    frozen = _json(executed.made)
    assert [r["runId"] for r in frozen["runs"]] == list(executed.runs)
    assert frozen["selection"]["since"].endswith("Z")  # the window as the time it names, not as "1h"

    assert executed.same.returncode == 0, executed.same.stdout + executed.same.stderr
    first = _json(executed.same)
    assert first["counts"] == {"match": len(PICKED)} and first["published"] > 0
    [cases] = list(junitparser.JUnitXml.fromfile(str(executed.junit)))
    assert (cases.tests, cases.failures, cases.errors, cases.skipped) == (len(PICKED), 0, 0, 0)

    assert executed.routed.returncode == 1, executed.routed.stdout + executed.routed.stderr
    report = _json(executed.routed)
    assert report["counts"] == {"diverged": len(REROUTED), "match": len(PICKED) - len(REROUTED)}
    [group] = report["groups"]
    assert sorted(group["runs"]) == [f"{tag}-{i}" for i in REROUTED]
    kind, event_type, node, path, at = ROUTING_SHOWS[executed.name]
    assert (group["kind"], group["eventType"], group["nodeId"], group["path"]) == (kind, event_type, node, path)
    assert group["example"]["firstDivergence"]["atSequence"] == at

    # The worker judged the published replays as the command did:
    # suite, execution, started_at, code_version, runs, matched, diverged, what_if, pending (newest first).
    assert [(r[1], r[3], r[4], r[5], r[6]) for r in executed.executions] == [
        (report["execution"], "routing-v2", len(PICKED), len(PICKED) - len(REROUTED), len(REROUTED)),
        (first["execution"], "same", len(PICKED), len(PICKED), 0)]


@pytest.fixture
def browser() -> Iterator[object]:
    """A headless Chromium for one test: Playwright's sync API keeps an event loop running in this thread while it
    is open, and the next framework's fixture runs its programs with asyncio.run."""
    chromium = require_tool("chromium")
    from playwright.sync_api import sync_playwright  # the [test] extra; imported only where a browser runs

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=os.path.realpath(chromium), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def test_the_console_suite_pages_render_both_executions_in_chromium(executed: Executed, store, browser, tmp_path):
    assert executed.executions, "the suite did not run (see the other test)"
    url = f"http://127.0.0.1:{store.settings.web_port}"
    routed = _json(executed.routed)
    tag = executed.runs[0].rsplit("-", 1)[0]
    kind, _, _, _, at = ROUTING_SHOWS[executed.name]
    context = browser.new_context(viewport={"width": 1300, "height": 900})  # type: ignore[attr-defined]
    try:
        page = context.new_page()
        page.goto(f"{url}/suites?{urlencode({'suite': executed.suite})}")
        rows = page.locator("#suites tr")
        assert rows.count() == 3  # the head and the two executions, newest first
        assert "routing-v2" in rows.nth(1).inner_text() and "same" in rows.nth(2).inner_text()
        _shot(page, tmp_path / f"suites-{executed.name}.png")

        page.locator("#suites tr").nth(1).locator("a").nth(1).click()  # the routing execution's page
        page.wait_for_selector("#suite-runs")
        assert page.url.endswith(f"/suites/{quote(routed['execution'], safe='')}")
        runs = page.locator("#suite-runs tr")
        assert runs.count() == 1 + len(PICKED)
        for i in range(1, 1 + len(REROUTED)):  # diverged first, each with its first divergence
            text = runs.nth(i).inner_text()
            assert "diverged" in text and f"{kind} at {at}" in text
        assert {runs.nth(i).locator("code").first.inner_text() for i in range(1, 1 + len(REROUTED))} == {
            f"{tag}-{i}" for i in REROUTED}
        assert page.locator("#suite-runs a:text('compare')").count() == len(PICKED)
        _shot(page, tmp_path / f"suite-execution-{executed.name}.png")
    finally:
        context.close()


def _shot(page: object, png: Path) -> None:
    page.screenshot(path=str(png))  # type: ignore[attr-defined]
    # A blank or single-colour page has 1-2 colours; text, tables and anti-aliasing give many more.
    assert distinct_colours(png.read_bytes()) > 50, f"{png.name} looks blank"
