"""Retention by run class on a real store: an expired run leaves every table, and the store then equals one that
never held it (rollups included), while runs of other classes stay."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import pytest

from agentlog.audit.migrations import migrate
from agentlog.audit.retention import RUN_TABLES, Retention, drop_runs, expired_runs, parse_retention
from agentlog.audit.store import open_store
from agentlog.schemas.errors import ConfigError
from tests.unit.audit.conftest import store_url  # noqa: F401  (fixture: chdb, and a server when set)
from tests.unit.audit.data import LLM_RUN, audit_batches
from tests.unit.audit.test_rollups import _MERGED

HOUR = 3_600_000


def sweep(s: Any, retention: Retention, now_ms: int) -> list[str]:
    """One sweep of the audit store, as the sink's (which shreds the keys in between)."""
    runs = expired_runs(s, retention, now_ms)
    drop_runs(s, runs)
    return runs
# The realistic run and the two child runs it dispatches (tests/unit/core/runs.py).
TREE = {"run-1", "run-1.child-a", "run-1.child-c"}


def _batches(run_class: str | None) -> dict[str, list[dict[str, Any]]]:
    """The audit scenario with run-1 (only the parent: its children name no class) of ``run_class``."""
    batches = copy.deepcopy(audit_batches())
    for rec in batches["committed"]:
        doc = rec["doc"]
        if doc["runId"] == "run-1" and doc["type"] == "run.started" and run_class is not None:
            doc["payload"]["runClass"] = run_class
    return batches


def _run_of(kind: str, rec: dict[str, Any]) -> set[str]:
    if kind == "committed":
        return {rec["doc"]["runId"]}
    if kind == "transition":
        return {rec["parentRunId"]}
    if kind == "verdict":
        return {rec["sourceRunId"], rec["replayRunId"]}
    return {rec.get("runId") or ""}


def _last_event_ms(batches: dict[str, list[dict[str, Any]]], runs: set[str]) -> int:
    return max(int(datetime.fromisoformat(r["doc"]["timestamp"]).timestamp() * 1000)
               for r in batches["committed"] if r["doc"]["runId"] in runs)


def _contents(s: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every per-run table's rows and every rollup merged, in a stable order (``recorded_at`` is the insert's clock)."""
    out = {name: s.query(q).rows for name, q in _MERGED.items()}
    for table in RUN_TABLES:
        if table in _MERGED:
            continue
        cols = [r[0] for r in s.query("SELECT name FROM system.columns WHERE database = currentDatabase() "
                                      "AND table = {t:String} AND default_kind != 'MATERIALIZED' "
                                      "AND name != 'recorded_at'", {"t": table}).rows]
        out[table] = s.query(f"SELECT {', '.join(cols)} FROM {table} ORDER BY ALL").rows
    return out


def _load(s: Any, batches: dict[str, list[dict[str, Any]]], drop: set[str] = frozenset(), *, token: str = "all") -> None:
    for kind, records in batches.items():
        kept = [r for r in records if not _run_of(kind, r) & drop]
        if kept:
            s.insert_records(kind, kept, dedup_token=f"{token}:{kind}")


def test_an_expired_run_leaves_with_its_children_and_the_store_equals_one_that_never_held_it(store_url):  # noqa: F811
    batches = _batches("ci")
    retention = parse_retention("ci=2h,*=forever")
    last = _last_event_ms(batches, TREE)
    with open_store(store_url) as s:
        migrate(s)
        _load(s, batches)
        before = _contents(s)
        assert sweep(s, retention, last + 2 * HOUR - 1) == []  # a millisecond early: nothing leaves
        assert _contents(s) == before
        assert set(sweep(s, retention, last + 2 * HOUR)) == TREE
        after = _contents(s)
        assert s.query("SELECT DISTINCT run_id FROM events").rows == [(LLM_RUN,)]  # no class: kept forever
        assert sweep(s, retention, last + 3 * HOUR) == []  # a second sweep finds nothing left to delete
        assert _contents(s) == after
        # the same store loaded with everything but the tree: what a store that never held it holds
        for table in [*RUN_TABLES, *_MERGED]:
            s.command(f"TRUNCATE TABLE {table}")
        _load(s, batches, drop=TREE, token="kept")
        assert _contents(s) == after
        assert after["events"] and after["usage_hourly"] and after["rejections"]


def test_a_class_of_its_own_and_the_default_for_runs_with_none(store_url):  # noqa: F811
    batches = _batches("prod")
    llm_last = _last_event_ms(batches, {LLM_RUN})
    with open_store(store_url) as s:
        migrate(s)
        _load(s, batches)
        # run-1 is prod (kept); the llm run has no class and takes '*'
        assert sweep(s, parse_retention("prod=forever,*=1h"), llm_last + HOUR) == [LLM_RUN]
        assert {r[0] for r in s.query("SELECT DISTINCT run_id FROM events").rows} == TREE
        # a child takes its parent's class even where '*' is shorter
        assert sweep(s, parse_retention("prod=forever,*=1s"), llm_last + 10 * 365 * 24 * HOUR) == []


def test_every_table_holding_a_run_column_is_swept(store_url):  # noqa: F811
    """A table added with a run column must be added to RUN_TABLES (or be a per-worker rollup)."""
    with open_store(store_url) as s:
        migrate(s)
        named = s.query("SELECT table, name FROM system.columns WHERE database = currentDatabase() "
                        "AND (name = 'run_id' OR name LIKE '%\\_run\\_id') AND table NOT LIKE '%\\_0001' "
                        "AND table NOT LIKE 'sink\\_%' AND table IN (SELECT name FROM system.tables "
                        "WHERE database = currentDatabase() AND engine != 'MaterializedView') ORDER BY table, name").rows
    columns: dict[str, set[str]] = {}
    for table, name in named:
        columns.setdefault(table, set()).add(name)
    swept = {t: set(c) for t, c in RUN_TABLES.items()}
    # a transition's child run is swept with its parent (the row belongs to the parent's dispatch)
    assert columns == {**swept, "transitions": swept["transitions"] | {"child_run_id"}}


@pytest.mark.parametrize(("text", "expected"), [
    ("", Retention({}, None)),
    ("ci=2h", Retention({"ci": 2 * HOUR}, None)),
    (" ci = 90s , dev=30m, prod=forever, *=7d ",
     Retention({"ci": 90_000, "dev": 1_800_000, "prod": None}, 7 * 24 * HOUR)),
])
def test_the_setting_reads_classes_durations_and_a_default(text, expected):
    assert parse_retention(text) == expected


@pytest.mark.parametrize(("text", "names"), [
    ("ci", "<class>=<duration>"),
    ("ci=2 hours", "not a duration"),
    ("ci=0h", "not a duration"),
    ("ci=-1d", "not a duration"),
    ("c i=2h", "<class>=<duration>"),
    ("ci=2h,ci=3h", "twice"),
    ("*=1d,*=2d", "twice"),
])
def test_a_bad_setting_is_refused_with_its_entry(text, names):
    with pytest.raises(ConfigError) as e:
        parse_retention(text)
    assert e.value.code == "bad_retention" and names in str(e.value)


def test_the_sweep_interval_follows_the_shortest_duration():
    assert parse_retention("").sweep_s is None
    assert parse_retention("prod=forever").sweep_s is None
    assert parse_retention("ci=2h,*=90d").sweep_s == 60.0
    assert parse_retention("ci=30s").sweep_s == 3.0
    assert parse_retention("ci=2s").sweep_s == 1.0
