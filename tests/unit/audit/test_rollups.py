"""Rollup repair: the state a SIGKILL leaves between the events part and the views, and its repair.

The state is made on a real store by detaching the views for one insert: the events are there,
the rollups never saw them (what 36 of 95 SIGKILLs of an inserting chdb process left).
"""

from __future__ import annotations

import re

import pytest

from agentlog.audit.migrations import migrate
from agentlog.audit.rollups import repair
from agentlog.audit.store import open_store
from tests.unit.audit.conftest import store_url  # noqa: F401  (fixture: chdb, and a server when set)
from tests.unit.audit.data import audit_batches

_FROM_ROLLUPS = {
    "run_rollup": "SELECT run_id, sum(events), min(started_at), max(ended_at), max(last_sequence), "
                  "argMaxMerge(status), round(sum(cost_cents), 6), sum(input_tokens), sum(output_tokens), "
                  "sum(refusals), sum(retries), sum(failures) FROM run_rollup GROUP BY run_id ORDER BY run_id",
    "usage_hourly": "SELECT run_id, provider, model, hour, sum(calls), sum(input_tokens), sum(output_tokens), "
                    "round(sum(cost_cents), 6) FROM usage_hourly GROUP BY run_id, provider, model, hour "
                    "ORDER BY run_id, provider, model, hour",
}
_FROM_EVENTS = {
    "run_rollup": "SELECT run_id, count(), min(event_time), max(event_time), max(sequence), "
                  "argMax(if(startsWith(type, 'run.'), substring(type, 5), ''), "
                  "if(startsWith(type, 'run.'), sequence + 1, toUInt64(0))), round(sum(cost_cents), 6), "
                  "sum(input_tokens), sum(output_tokens), countIf(refusal), countIf(type = 'node.retried'), "
                  "countIf(handoff_phase IN ('dispatch.failed', 'child.failed', 'child.cancelled')) "
                  "FROM events GROUP BY run_id ORDER BY run_id",
    "usage_hourly": "SELECT run_id, provider, model, toStartOfHour(event_time) AS hour, count(), sum(input_tokens), "
                    "sum(output_tokens), round(sum(cost_cents), 6) FROM events WHERE type = 'provider.usage' "
                    "GROUP BY run_id, provider, model, hour ORDER BY run_id, provider, model, hour",
}


def _agree(s) -> bool:
    return all(s.query(_FROM_ROLLUPS[r]).rows == s.query(_FROM_EVENTS[r]).rows for r in _FROM_ROLLUPS)


def test_rollups_short_of_a_batch_are_repaired_from_events_once(store_url):  # noqa: F811
    committed = audit_batches()["committed"]
    half = len(committed) // 2
    migrate(store_url)
    with open_store(store_url) as s:
        s.insert_records("committed", committed[:half], dedup_token="log/0/0-1")
        assert _agree(s)
        runs = sorted({r["doc"]["runId"] for r in committed})
        assert repair(s, runs) == {}  # nothing short: nothing written
        for view in ("usage_hourly_mv", "run_rollup_mv"):
            s.command(f"DETACH TABLE {view}")
        s.insert_records("committed", committed[half:], dedup_token="log/0/2-3")  # the views never see it
        for view in ("usage_hourly_mv", "run_rollup_mv"):
            s.command(f"ATTACH TABLE {view}")
        assert not _agree(s)
        short = repair(s, runs)
        assert set(short) == {"usage_hourly", "run_rollup"} and all(short.values())
        assert _agree(s)
        assert repair(s, runs) == {}  # a second repair (a crash during the first) adds nothing
        assert _agree(s)


# Every rollup, read merged (a rollup's rows sum or merge to these).
_MERGED = {
    **_FROM_ROLLUPS,
    "handoff_steps": "SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, sum(weight) AS w "
                     "FROM handoff_steps GROUP BY ALL HAVING w != 0 ORDER BY ALL",
    "worker_failures": "SELECT worker_id, phase, error_code, uniqExactMerge(transitions), uniqExactMerge(runs) "
                       "FROM worker_failures GROUP BY ALL ORDER BY ALL",
    "worker_dispatches": "SELECT worker_id, uniqExactMerge(dispatches) FROM worker_dispatches GROUP BY ALL ORDER BY ALL",
}


def test_every_rollup_emptied_is_rebuilt_exactly_by_its_views_own_select(loaded_store):
    """The repair runs each view's SELECT from the migrations, so it rebuilds what the view built, for every view."""
    s = loaded_store
    views = s.query("SELECT create_table_query FROM system.tables WHERE database = currentDatabase() "
                    "AND engine = 'MaterializedView'").rows
    targets = {re.search(r" TO (?:\w+\.)?(\w+)", ddl).group(1) for (ddl,) in views}
    assert targets == set(_MERGED)  # a new rollup needs its merged reading here
    built = {r: s.query(q).rows for r, q in _MERGED.items()}
    assert all(built.values())
    runs = {"events": [r["doc"]["runId"] for r in audit_batches()["committed"]],
            "transitions": [r["parentRunId"] for r in audit_batches()["transition"]]}
    for source, ids in runs.items():
        assert repair(s, ids, source=source) == {}  # the views built them: nothing short
    for rollup in _MERGED:
        s.command(f"TRUNCATE TABLE {rollup}")
    assert set(repair(s, runs["events"])) == {"usage_hourly", "run_rollup"}
    assert set(repair(s, runs["transitions"], source="transitions")) == {"handoff_steps"}
    assert {r: s.query(q).rows for r, q in _MERGED.items()} == built


def test_a_view_whose_rollup_the_repair_cannot_follow_is_refused():
    from agentlog.audit.rollups import _repair_of

    def create(kind: str) -> str:
        return f"CREATE TABLE IF NOT EXISTS r\n(\n    run_id String,\n    n {kind}\n)\nENGINE = AggregatingMergeTree\nORDER BY run_id"

    cases = [  # (SELECT, the rollup's column n): not a source the sink repairs from; not a sum nor idempotent;
        ("SELECT run_id, count() AS n\nFROM violations\nGROUP BY run_id", "SimpleAggregateFunction(sum, UInt64)"),
        ("SELECT run_id, countState() AS n\nFROM events\nGROUP BY run_id", "AggregateFunction(count)"),
        ("SELECT run_id, sum(sequence) AS n\nFROM events\nGROUP BY run_id", "SimpleAggregateFunction(sum, UInt64)"),
    ]  # and a sum with no count() column to tell a short rollup by
    for select, kind in cases:
        with pytest.raises(ValueError):
            _repair_of("r_mv", "r", select, create(kind))
