"""The web console in a real headless Chromium (Debian's, driven by Playwright) against a worker fed by the demo.

Each page is checked for what it must show and photographed; a screenshot must show a
picture (many distinct colours, read with zlib alone: tests/unit/audit/pngcheck.py). Set
``AGENTLOG_CONSOLE_SHOTS=<dir>`` to keep the screenshots (README "Console" uses them).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest

from agentlog.demo.tour import play_run
from agentlog.streams.publisher import Publisher
from tests.integration.console.conftest import DemoConsole
from tests.tools import require_tool
from tests.unit.audit.pngcheck import distinct_colours

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium = require_tool("chromium")
    from playwright.sync_api import sync_playwright  # the [test] extra; imported only where a browser runs

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=os.path.realpath(chromium), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


def _shot(page, tmp_path: Path, name: str) -> None:
    png = tmp_path / f"{name}.png"
    page.screenshot(path=str(png))
    # A blank or single-colour page has 1-2 colours; text, boxes, charts and anti-aliasing give hundreds.
    assert distinct_colours(png.read_bytes()) > 50, f"{name} screenshot looks blank"
    keep = os.environ.get("AGENTLOG_CONSOLE_SHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)


def test_the_demo_ends_by_printing_the_console_url_of_its_run(demo_console: DemoConsole):
    last = [line for line in demo_console.printed.splitlines() if line.strip()][-1]
    assert last.endswith(f"{demo_console.url}/runs/{demo_console.summary.run_id}"), last


def test_runs_page_lists_the_demo_run(demo_console: DemoConsole, page, tmp_path: Path):
    run_id = demo_console.summary.run_id
    page.goto(demo_console.url + "/")
    row = page.locator(f'tr.run[data-run-id="{run_id}"]')
    assert row.count() == 1
    text = row.inner_text()
    assert str(len(demo_console.timeline)) in text and "completed" in text
    assert "diverged_at_refusal" in text  # the last replay verdict of the demo run
    # The replays were recorded as runs of their own.
    for replay in demo_console.summary.replays:
        assert page.locator(f'tr.run[data-run-id="{replay["replayRunId"]}"]').count() == 1
    page.select_option("select[name=verdict]", "diverged_at_refusal")
    page.click("button[type=submit]")
    page.wait_for_url("**verdict=diverged_at_refusal**")
    assert [r.get_attribute("data-run-id") for r in page.locator("tr.run").all()] == [run_id]
    page.goto(demo_console.url + "/")
    _shot(page, tmp_path, "console-runs")


def test_run_page_shows_events_graph_and_state_at_a_chosen_index(demo_console: DemoConsole, page, tmp_path: Path):
    run_id = demo_console.summary.run_id
    page.goto(f"{demo_console.url}/runs/{quote(run_id, safe='')}")
    types = [r.get_attribute("data-type") for r in page.locator("table.events tbody tr").all()]
    assert types == [r["type"] for r in demo_console.timeline]
    assert page.locator("svg.graph g.node").count() == len(demo_console.timeline)
    assert page.locator("svg.graph path.edge").count() > 0
    assert page.locator("svg.timeline g.phase").count() == len(demo_console.summary.transitions)
    assert page.locator("#head-hash").inner_text() == demo_console.summary.head_hash
    assert "chain verifies" in page.locator("#run-meta").inner_text()
    verdicts = {v.get_attribute("data-verdict") for v in page.locator("tr.verdict").all()}
    assert verdicts == {"diverged", "diverged_at_refusal"}

    # Drag the slider to the index of the goal variable: the state there comes from the fold,
    # and the variable that event wrote is highlighted as changed.
    goal_at = demo_console.index_of("variable.changed")
    page.eval_on_selector("#slider", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                          str(goal_at))
    page.wait_for_selector(f'#state-caption[data-index="{goal_at}"]')
    assert page.locator('#state [data-key="variables.goal"].changed').count() == 1
    assert page.locator('#state [data-key="status"]').inner_text().strip() == "running"
    assert page.locator(f"#ev-{goal_at}.current").count() == 1
    # One index earlier the variable does not exist yet.
    page.eval_on_selector("#slider", "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                          str(goal_at - 1))
    page.wait_for_selector(f'#state-caption[data-index="{goal_at - 1}"]')
    assert page.locator('#state [data-key="variables.goal"]').count() == 0
    _shot(page, tmp_path, "console-run")


def test_run_page_draws_the_agents_and_a_box_opens_its_child_run(demo_console: DemoConsole, page, tmp_path: Path):
    run_id = demo_console.summary.run_id
    page.goto(f"{demo_console.url}/runs/{quote(run_id, safe='')}")
    workers = {t["workerId"] for t in demo_console.summary.transitions if t.get("workerId")}
    drawn = {a.get_attribute("data-agent") for a in page.locator("svg.agents .agent").all()}
    assert drawn == {run_id, *workers}
    dispatches = sum(1 for t in demo_console.summary.transitions if t["phase"] == "dispatch.began")
    counts = [int(h.get_attribute("data-count")) for h in page.locator("svg.agents g.handoff").all()]
    assert sum(counts) == dispatches
    # A box opens its agent's child run when the store holds that run's events; one nobody recorded is named only.
    for box in page.locator("svg.agents a.agent").all():
        with urllib.request.urlopen(demo_console.url + box.get_attribute("href"), timeout=30) as answer:
            assert answer.status == 200 and f'parent: <a href="/runs/{run_id}">' in answer.read().decode()
    for box in page.locator("svg.agents g.agent").all():
        if box.get_attribute("data-agent") != run_id:
            assert "recorded)" in (box.text_content() or "") or box.get_attribute("data-runs") == "0"
    page.locator("h2:text('Agents')").scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, document.querySelector('#run-agents').getBoundingClientRect().top - 60)")
    _shot(page, tmp_path, "console-agents")


def test_compare_page_marks_the_refusal_divergence(demo_console: DemoConsole, page, tmp_path: Path):
    summary = demo_console.summary
    refusal = next(r for r in summary.replays if r["verdict"] == "diverged_at_refusal")
    answered_at = demo_console.index_of("agent.invocation.completed", node="worker-1")
    page.goto(f"{demo_console.url}/runs/{quote(summary.run_id, safe='')}")
    page.click('tr.verdict[data-verdict="diverged_at_refusal"] a:text("compare side by side")')
    page.wait_for_selector("#first-divergence-box")
    box = page.locator("#first-divergence-box")
    assert box.get_attribute("data-kind") == "refusal"
    assert box.get_attribute("data-at") == str(answered_at)
    assert "diverged_at_refusal" in box.inner_text() and "Refusal divergence" in box.inner_text()
    assert refusal["replayRunId"] in page.locator("h1").inner_text()
    row = page.locator(f"#idx-{answered_at}")
    assert "divergence" in (row.get_attribute("class") or "").split()
    assert "envelope.refusal" in row.inner_text() and "agent.invocation.completed" in row.inner_text()
    assert page.locator(".field.volatile").count() > 0  # ids and timestamps dimmed
    _shot(page, tmp_path, "console-compare")
    # The replays page compares the replay that started last: the refusal one.
    page.goto(f"{demo_console.url}/runs/{quote(summary.run_id, safe='')}/replays")
    assert page.locator("tr.verdict").count() == 2
    assert page.locator("#first-divergence-box").get_attribute("data-kind") == "refusal"


def test_compare_page_picks_two_runs_by_search_and_from_the_recent_runs(demo_console: DemoConsole, page,
                                                                         tmp_path: Path):
    summary = demo_console.summary
    run_id = summary.run_id
    refusal = next(r for r in summary.replays if r["verdict"] == "diverged_at_refusal")
    answered_at = demo_console.index_of("agent.invocation.completed", node="worker-1")
    page.goto(demo_console.url + "/")
    page.click("nav a:text('Compare')")
    page.wait_for_selector("#compare-picker")
    assert page.locator("#first-divergence-box").count() == 0

    # Search as you type: the runs whose id holds the typed text, asked of the worker's /query.
    typed = run_id[-5:].upper()
    page.fill("#pick-a", typed)
    page.wait_for_function(f"document.getElementById('pick-a').dataset.searched === '{typed}'")
    offered = page.eval_on_selector_all("#runs-a option", "els => els.map(e => e.value)")
    assert run_id in offered and all(typed.lower() in o.lower() for o in offered), offered

    # Pick A and B from the recent runs; the radios fill the two fields.
    page.check(f'input[name="recent-a"][value="{run_id}"]')
    page.check(f'input[name="recent-b"][value="{refusal["replayRunId"]}"]')
    assert page.input_value("#pick-a") == run_id and page.input_value("#pick-b") == refusal["replayRunId"]
    _shot(page, tmp_path, "console-compare-pick")
    page.click("#compare-picker button[type=submit]")
    page.wait_for_selector("#first-divergence-box")
    box = page.locator("#first-divergence-box")
    assert (box.get_attribute("data-verdict"), box.get_attribute("data-kind"), box.get_attribute("data-at")) == (
        "diverged_at_refusal", "refusal", str(answered_at))
    assert refusal["replayRunId"] in page.locator("h1").inner_text()


def test_analytics_charts_render(demo_console: DemoConsole, page, tmp_path: Path):
    page.goto(demo_console.url + "/analytics")
    assert page.locator("figure.chart").count() == 5
    assert page.locator("figure.chart circle.dot").count() >= 1  # cost/tokens of the demo's model
    assert "anthropic/claude-sonnet-4" in page.locator("#charts").inner_text()
    assert page.locator("figure.chart rect.bar").count() >= 3  # refusal rate, latency, …
    _shot(page, tmp_path, "console-analytics")


def test_headless_dump_dom_lists_the_run_and_its_verdicts(demo_console: DemoConsole, tmp_path: Path):
    chromium = require_tool("chromium")

    def dump(url: str) -> str:
        profile = tempfile.mkdtemp(dir=tmp_path)
        out = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={profile}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=120, check=False)
        return out.stdout

    run_id = demo_console.summary.run_id
    assert f'data-run-id="{run_id}"' in dump(demo_console.url + "/")
    dom = dump(f"{demo_console.url}/runs/{quote(run_id, safe='')}")
    for type_ in {r["type"] for r in demo_console.timeline}:
        assert type_ in dom
    assert "diverged_at_refusal" in dom and "replay_diverged_at_refusal" in dom


def test_runs_page_follows_new_runs_live(demo_console: DemoConsole, page):
    page.goto(demo_console.url + "/")
    refreshed = page.evaluate("document.body.dataset.refreshed || ''")
    new_run = f"live-{uuid.uuid4().hex[:6]}"

    async def publish() -> None:
        async with Publisher(demo_console.settings) as pub:
            await play_run(pub, new_run, pace=0)

    # Playwright's sync API runs its own event loop in this thread: publish from another one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, publish()).result(timeout=120)
    # No reload: the page re-reads itself and swaps the table in.
    page.wait_for_selector(f'tr.run[data-run-id="{new_run}"]', timeout=90_000)
    assert page.evaluate("document.body.dataset.refreshed || ''") != refreshed


def test_an_open_run_page_follows_its_run_live(demo_console: DemoConsole, page):
    run_id = f"slow-{uuid.uuid4().hex[:6]}"
    url = f"{demo_console.url}/runs/{run_id}"

    async def publish() -> list:
        async with Publisher(demo_console.settings) as pub:
            return await play_run(pub, run_id, pace=10.0)  # ~15 s of simulated think time

    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(asyncio.run, publish())
        deadline = time.monotonic() + 60
        while True:  # the page answers once the sink has written the run's first events
            try:
                with urllib.request.urlopen(url, timeout=10):
                    break
            except urllib.error.HTTPError as e:
                assert e.code == 404 and time.monotonic() < deadline, f"{url} answered {e.code}"
                time.sleep(0.3)
        page.goto(url)
        first = page.locator("table.events tbody tr").count()
        total = len(sent.result(timeout=120))
    assert 0 < first < total, "the run finished before the page opened: nothing left to follow"
    page.wait_for_function(f"document.querySelectorAll('table.events tbody tr').length === {total}",
                           timeout=90_000)
    assert page.locator("#slider").get_attribute("max") == str(total - 1)
    assert page.locator("svg.graph g.node").count() == total
