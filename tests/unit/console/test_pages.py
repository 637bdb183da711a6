"""The console's pages, rendered offline from a chdb store holding the realistic scenario and golden replay pairs.

Checked: what each page must show, that it loads nothing from elsewhere, that user data is escaped,
and that a caller's mistake gets a page that says what to do.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agentlog.audit.queries import run_named
from agentlog.console import (
    analytics_view,
    chain_problem,
    compare_view,
    replays_view,
    run_view,
    runs_view,
    state_fragment,
)
from agentlog.console.pages import render_runs_page
from agentlog.replay.compare import compare_runs
from tests.unit.audit.data import LLM_RUN, committed
from tests.unit.core.runs import realistic_run

pytestmark = pytest.mark.timeout(120)

GOLDEN = Path(__file__).parents[1] / "replay" / "golden"


class _Loads(HTMLParser):
    """Every attribute that could make the browser fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        for k, v in attrs:
            if k in ("src", "srcset", "xlink:href") or (k == "href" and tag == "link") or (
                    v and "url(" in v and "url(#" not in v):
                self.loads.append((tag, k, v))


def _self_contained(html: str) -> None:
    parser = _Loads()
    parser.feed(html)
    assert parser.loads == []
    assert not re.search(r"https?://", html.replace("http://www.w3.org/2000/svg", ""))


def _golden(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def test_runs_page_lists_runs_with_their_figures(loaded_store):
    status, html = runs_view(loaded_store, {})
    assert status == 200
    _self_contained(html)
    assert html.index('data-run-id="run-llm"') < html.index('data-run-id="run-1"')  # newest first
    row = re.search(r'<tr class="run" data-run-id="run-1">.*?</tr>', html).group(0)
    assert "handoff_failed" in row and "diverged_at_refusal" in row and "20" in row
    status, html = runs_view(loaded_store, {"model": "gpt-y"})
    assert re.findall(r'data-run-id="([^"]+)"', html) == [LLM_RUN]
    assert 'value="gpt-y"' in html  # the filter is kept in the form


def test_runs_page_pages(loaded_store):
    _, first = runs_view(loaded_store, {"limit": "1"})
    _, second = runs_view(loaded_store, {"limit": "1", "offset": "1"})
    assert re.findall(r'data-run-id="([^"]+)"', first) == [LLM_RUN]
    assert re.findall(r'data-run-id="([^"]+)"', second) == ["run-1"]
    assert "offset=2" in second and "offset=0" in second


def test_bad_filters_say_what_to_fix(loaded_store):
    status, html = runs_view(loaded_store, {"since": "last tuesday"})
    assert status == 400 and "ISO 8601" in html and "bad_param" in html
    assert runs_view(loaded_store, {"limit": "many"})[0] == 400


def test_run_page_shows_state_graph_events_and_verdicts(loaded_store):
    status, html = run_view(loaded_store, "run-1", {"at": "1"})
    assert status == 200
    _self_contained(html)
    assert html.count('<g class="node') == 20 and 'class="timeline"' in html
    assert html.count('<tr id="ev-') == 20
    assert 'id="state-caption" data-index="1"' in html and 'data-key="variables.goal"' in html
    assert '<span id="run-status"><span class="badge completed">' in html  # final status, whatever the index
    assert "chain verifies" in html
    assert html.count('class="verdict"') == 2 and "run-1.replay-2" in html
    assert 'href="/runs/run-1.child-a"' in html  # its children link
    _, child = run_view(loaded_store, "run-1.child-a", {})
    assert 'parent: <a href="/runs/run-1">' in child


def test_state_fragment_is_the_state_at_the_index(loaded_store):
    status, html = state_fragment(loaded_store, "run-1", {"at": "0"})
    assert status == 200 and 'data-index="0"' in html and 'class="kv changed" data-key="status"' in html
    assert "<html" not in html


def test_a_missing_run_is_a_404_that_says_so(loaded_store):
    status, html = run_view(loaded_store, "no-such-run", {})
    assert status == 404 and "no-such-run" in html and "unknown_run" in html


def test_chain_problem_finds_an_altered_event():
    docs = realistic_run("run-c", mode="check")
    records = committed(docs)
    hashes = [(r["doc"]["sequence"], r["prevHash"], r["hash"]) for r in records]
    assert chain_problem(docs, hashes) is None
    altered = [dict(d) for d in docs]
    altered[4] = {**altered[4], "nodeId": "intruder"}
    assert "sequence 4" in chain_problem(altered, hashes)
    relinked = [*hashes[:3], (3, "0" * 64, hashes[3][2]), *hashes[4:]]
    assert "sequence 3" in chain_problem(docs, relinked)


def test_compare_page_marks_the_refusal_divergence(store):
    original, replay = _golden("refusal.original"), _golden("refusal.replay")
    store.insert_records("committed", committed(original) + committed(replay, partition=1))
    expected = compare_runs(original, replay)
    status, html = compare_view(store, {"a": original[0]["runId"], "b": replay[0]["runId"]})
    assert status == 200
    _self_contained(html)
    at = expected.first_divergence.at_sequence
    assert f'data-kind="refusal" data-at="{at}"' in html and "Refusal divergence" in html
    assert f'<tr id="idx-{at}" class="divergence"' in html
    assert 'class="field volatile" data-path="eventId"' in html
    # One run chosen: the picker, with A filled in; a run not in the store: 404, the picker and what is wrong.
    status, html = compare_view(store, {"a": original[0]["runId"]})
    assert status == 200 and 'id="first-divergence-box"' not in html
    assert f'id="pick-a" name="a" list="runs-a" value="{original[0]["runId"]}"' in html
    status, html = compare_view(store, {"a": original[0]["runId"], "b": "nope"})
    assert status == 404 and 'id="compare-picker"' in html
    assert re.search(r'id="compare-problem">run &#x27;nope&#x27; has no events', html)


def _radio_values(html: str, side: str) -> list[str]:
    return re.findall(rf'<input type="radio" name="recent-{side}" value="([^"]*)"', html)


@pytest.mark.parametrize(("a", "b"), [("interleaved.original", "interleaved-result.original"),
                                      ("match.original", "interleaved.original")])
def test_compare_page_picks_any_two_runs_and_judges_them_as_agentlog_compare(store, tmp_path, a, b):
    """Two runs neither of which is a replay of the other: the page's verdict, first divergence and marked
    indexes are those ``agentlog compare A.jsonl B.jsonl --all`` prints for the same runs."""
    from typer.testing import CliRunner

    from agentlog.cli import app

    runs = {name: _golden(name) for name in ("interleaved.original", "interleaved-result.original",
                                             "match.original")}
    for i, docs in enumerate(runs.values()):
        store.insert_records("committed", committed(docs, partition=i))
    files = {}
    for name in (a, b):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(d) + "\n" for d in runs[name]))
    cli = CliRunner().invoke(app, ["compare", str(files[a]), str(files[b]), "--json", "--all"])
    assert cli.exit_code in (0, 1), cli.output
    expected = json.loads(cli.output)

    a_id, b_id = runs[a][0]["runId"], runs[b][0]["runId"]
    status, html = compare_view(store, {"a": a_id, "b": b_id})
    assert status == 200
    loads = _Loads()  # the runs' tool arguments hold URLs (data, shown as text): only loads are checked
    loads.feed(html)
    assert loads.loads == []
    box = re.search(r'<div class="divergence-box[^"]*" id="first-divergence-box"([^>]*)>', html).group(1)
    assert f'data-verdict="{expected["verdict"]}"' in box
    first = expected.get("firstDivergence")
    if first is None:
        assert "data-at" not in box
    else:
        assert f'data-kind="{first["kind"]}" data-at="{first["atSequence"]}"' in box
    listed = re.findall(r'<tr class="divergence-row" data-at="(\d+)" data-kind="([^"]+)">', html)
    divergences = expected.get("divergences") or []
    assert listed == ([(str(d["atSequence"]), d["kind"]) for d in divergences] if len(divergences) > 1 else [])
    marked = {int(i) for i in re.findall(r'<tr id="idx-(\d+)" class="diverg', html)}
    assert marked <= {d["atSequence"] for d in divergences}
    # The picker offers every stored run on both sides, A and B chosen.
    ids = sorted(docs[0]["runId"] for docs in runs.values())
    assert sorted(_radio_values(html, "a")) == ids and sorted(_radio_values(html, "b")) == ids
    assert f'name="recent-a" value="{a_id}" data-fills="pick-a" aria-label="A: {a_id}" checked' in html
    assert f'name="recent-b" value="{b_id}" data-fills="pick-b" aria-label="B: {b_id}" checked' in html


def test_compare_page_without_runs_is_the_picker_of_recent_runs(loaded_store):
    status, html = compare_view(loaded_store, {})
    assert status == 200 and 'id="first-divergence-box"' not in html
    _self_contained(html)
    newest = [r["run_id"] for r in runs_view_rows(loaded_store)][:20]
    assert _radio_values(html, "a") == newest and _radio_values(html, "b") == newest
    assert re.findall(r'<datalist id="runs-a">(.*?)</datalist>', html)[0].count("<option") == len(newest)


def test_replays_page_compares_the_latest_replay(loaded_store):
    status, html = replays_view(loaded_store, "run-1")
    # run-1.replay-2 has no events in the store: only the verdict records are listed.
    assert status == 200 and html.count('class="verdict"') == 2


def test_analytics_draws_every_chart(loaded_store):
    status, html = analytics_view(loaded_store, {})
    assert status == 200
    _self_contained(html)
    assert html.count('<figure class="chart">') == 5
    assert html.count('class="dot"') >= 3  # three models' cost
    assert "anthropic/claude-x (2/3)" in html and "sequence_gap" in html and "p50" in html


def test_user_data_is_escaped():
    row = {"run_id": "<script>alert(1)</script>", "status": "running", "flags": ["<b>"], "replays": 0}
    html = render_runs_page([row], {"model": '"><img src=x>'}, limit=10, offset=0)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert '"><img src=x>' not in html


def runs_view_rows(store) -> list[dict]:
    """The runs, newest first, as the runs page lists them (the ``runs`` named query)."""
    return run_named(store, "runs", {}).to_dicts()


def test_run_page_draws_the_agents_and_each_opens_its_child_run(loaded_store):
    _, html = run_view(loaded_store, "run-1", {})
    agents = re.search(r'<div class="scroll" id="run-agents" data-live>(.*?)</div>', html, re.S).group(1)
    assert re.findall(r'data-agent="([^"]+)"', agents.split("<table")[0]) == ["run-1", "worker-a", "worker-b",
                                                                               "worker-c"]
    assert '<a href="/runs/run-1.child-a" class="agent" data-agent="worker-a"' in agents
    assert 'data-from="run-1" data-to="worker-b" data-count="1" data-failed="1"' in agents
