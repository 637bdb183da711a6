"""A long run's page: one page of events by sequence, the slider over the whole run, content opened per page.

The run is :func:`tests.bench.workload.long_run` (the realistic planner tree's body over and over),
stored sealed as the sequencer stores it; the console opens it with the run's key. Sizes and page
structure are asserted, never times (tests/bench/bench_console.py measures those).
"""

from __future__ import annotations

import os
import re

import pytest

from agentlog.console import run_view, state_at, state_fragment
from agentlog.console.views import EVENTS_PER_PAGE
from agentlog.core.keyring import LocalKek
from agentlog.streams.keyring import Keyring
from tests.bench.workload import long_run
from tests.unit.audit.data import INGEST_TOPIC, store_sealed

pytestmark = pytest.mark.timeout(120)

RUN = "long-1"
EVENTS = 1_200


@pytest.fixture
def long_store(store):
    kek = LocalKek(os.urandom(32))
    keyring = Keyring(kek, {kek.kek_id: kek})
    docs = long_run(RUN, EVENTS)
    store_sealed(store, docs, keyring)
    return store, keyring, docs


def _rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="ev-(\d+)"', html)]


def test_the_first_page_holds_the_page_of_the_last_index_and_the_slider_spans_the_run(long_store):
    store, keyring, docs = long_store
    status, html = run_view(store, RUN, {}, keyring.open)
    assert status == 200 and "chain verifies" in html  # the chain check covers all 1,200 events
    last_page = (EVENTS - 1) // EVENTS_PER_PAGE * EVENTS_PER_PAGE
    assert _rows(html) == list(range(last_page, EVENTS))
    assert f'id="slider" name="at" min="0" max="{EVENTS - 1}" value="{EVENTS - 1}"' in html
    assert f'<div class="stat"><b>{EVENTS}</b><span>events</span>' in html  # figures cover the run
    assert html.count('<g class="node') == EVENTS - last_page  # the graph draws the page
    assert '<span id="run-status"><span class="badge completed">' in html
    assert "$sealed" not in html  # the page's content and the state are opened


def test_pages_follow_by_sequence_and_link_to_each_other(long_store):
    store, keyring, _ = long_store
    _, first = run_view(store, RUN, {"from": "0"}, keyring.open)
    assert _rows(first) == list(range(EVENTS_PER_PAGE))
    assert 'href="/runs/long-1?from=500"' in first and 'class="page-previous"' not in first
    _, middle = run_view(store, RUN, {"from": "500"}, keyring.open)
    assert _rows(middle) == list(range(500, 1000))
    assert 'class="page-previous" href="/runs/long-1?from=0"' in middle
    assert 'class="page-last" href="/runs/long-1?from=1000"' in middle
    # limit is kept in every link; from is any sequence, not only a page start
    _, small = run_view(store, RUN, {"from": "777", "limit": "10"}, keyring.open)
    assert _rows(small) == list(range(777, 787)) and 'href="/runs/long-1?from=787&amp;limit=10"' in small


def test_an_index_on_another_page_opens_that_page_with_the_state_there(long_store):
    """Event 900 of a 1,200-event run is not on the page the run opens on: ``?at=900`` opens the page holding it."""
    store, keyring, docs = long_store
    _, html = run_view(store, RUN, {"at": "900"}, keyring.open)
    assert _rows(html) == list(range(500, 1000))
    assert 'id="state-caption" data-index="900"' in html
    assert '<tr id="ev-900" data-index="900"' in html
    assert '<span id="run-status"><span class="badge completed">' in html  # the run's status, not index 900's
    _, other = run_view(store, RUN, {"at": "900", "from": "0"}, keyring.open)
    assert 'id="at-events" href="/runs/long-1?at=900">' in other  # the slider's link to the events around 900


def test_the_page_does_not_grow_with_the_run(store, long_store):
    store, keyring, _ = long_store
    _, small = run_view(store, RUN, {}, keyring.open)
    docs = long_run("long-2", 4 * EVENTS)
    store_sealed(store, docs, keyring)
    _, big = run_view(store, "long-2", {"from": "0"}, keyring.open)
    _, big_first = run_view(store, RUN, {"from": "0"}, keyring.open)
    assert len(_rows(big)) == EVENTS_PER_PAGE
    assert len(big) < 1.25 * len(big_first)  # four times the events, the same page
    assert len(big) < 2_000_000


def test_the_state_fragment_is_the_fold_of_the_opened_run(long_store):
    store, keyring, docs = long_store
    for at in (0, 26, 900, EVENTS - 1):
        _, html = state_fragment(store, RUN, {"at": str(at)}, keyring.open)
        assert f'data-index="{at}"' in html and "$sealed" not in html
        view = state_at(docs, at)
        for name in view.parts["variables"]:
            assert f'data-key="variables.{name}"' in html
    _, html = state_fragment(store, RUN, {"at": "100000"}, keyring.open)
    assert f'data-index="{EVENTS - 1}"' in html  # clamped to the run


def test_a_long_state_shows_what_changed_and_the_latest_keys(long_store):
    store, keyring, docs = long_store
    view = state_at(docs, EVENTS - 1)
    handoffs = len(view.parts["handoffs"])
    assert handoffs > 100
    _, html = state_fragment(store, RUN, {}, keyring.open)
    assert html.count('data-key="handoffs.') == 100
    assert f"{handoffs - 100} earlier handoffs not shown" in html
    assert f'data-key="handoffs.{list(view.parts["handoffs"])[-1]}"' in html


def test_bad_paging_parameters_say_what_to_fix(long_store):
    store, keyring, _ = long_store
    status, html = run_view(store, RUN, {"from": "later"}, keyring.open)
    assert status == 400 and "from" in html and "bad_param" in html
    assert run_view(store, RUN, {"limit": "-3"}, keyring.open)[0] == 400


def test_an_open_page_polls_a_head_that_moves_only_with_the_run(long_store):
    """A live run page reads itself again only when ``/runs/<id>/head`` changes: the head the page carries is what
    the head answers while the run stands still, and another value once an event is added."""
    from agentlog.console import run_head

    store, keyring, docs = long_store
    _, html = run_view(store, RUN, {}, keyring.open)
    carried = re.search(r'data-head="/runs/long-1/head" data-head-value="([^"]+)"', html).group(1)
    status, head = run_head(store, RUN)
    assert status == 200 and head == carried and head.startswith(f"{EVENTS} ")
    extra = {**docs[-1], "sequence": EVENTS, "eventId": f"{RUN}:extra", "type": "channel.written",
             "payload": {"channel": "progress", "value": "late"}}
    store.insert_records("committed", [{"doc": extra, "prevHash": "0" * 64, "hash": "f" * 64, "stateHash": "0" * 64,
                                        "source": {"topic": INGEST_TOPIC, "partition": 0, "offset": EVENTS,
                                                   "timestampMs": 0}}])
    assert run_head(store, RUN)[1] != carried


def test_the_compare_page_of_two_long_runs_shows_the_page_of_the_first_divergence(store):
    """Two 1,200-event runs, the replay diverging at a variable past index 900: the page holds that index, the
    pager walks the rest, and every divergence links to the page that starts at it."""
    from agentlog.console import compare_view
    from agentlog.console.pages import ALIGNED_PER_PAGE
    from tests.unit.audit.data import committed
    from tests.unit.replay.runs import as_replay

    original = long_run("long-a", EVENTS)
    replay = as_replay(original, replay_run_id="long-b")
    at = next(i for i, d in enumerate(replay) if i >= 900 and d["type"] == "variable.changed")
    replay[at]["payload"]["value"] = "something else"
    store.insert_records("committed", committed(original) + committed(replay, partition=1))
    status, html = compare_view(store, {"a": "long-a", "b": "long-b"})
    assert status == 200
    begin = at - at % ALIGNED_PER_PAGE
    assert [int(i) for i in re.findall(r'<tr id="idx-(\d+)"', html)] == list(range(begin, begin + ALIGNED_PER_PAGE))
    assert f'<tr id="idx-{at}" class="divergence"' in html and f'data-at="{at}"' in html
    assert 'href="/compare?a=long-a&amp;b=long-b&amp;from=0">« first</a>' in html
    assert len(html) < 1_000_000
    _, first = compare_view(store, {"a": "long-a", "b": "long-b", "from": "0", "limit": "50"})
    assert [int(i) for i in re.findall(r'<tr id="idx-(\d+)"', first)] == list(range(50))
    assert 'href="/compare?a=long-a&amp;b=long-b&amp;from=50&amp;limit=50">later →</a>' in first
    assert 'id="first-divergence-box"' in first  # the verdict and first divergence whatever the page
