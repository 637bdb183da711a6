"""The ``runs`` named query (the console's fixed interface) on the realistic scenario of tests/unit/audit/data.py.

run-1 (check mode, 10:00:00-10:00:19) completes with worker-b's dispatch failed and worker-c's child
cancelled, one violation and two replays (the later one diverged at a refusal); run-llm
(11:00:00-11:00:13) has three refusals and 1.75 cents of usage; the child runs of run-1 have none of it.
"""

from __future__ import annotations

import pytest

from agentlog.audit.queries import NAMED_QUERIES, run_named
from agentlog.schemas.errors import StoreError
from tests.unit.audit.data import LLM_RUN, committed
from tests.unit.core.runs import child_runs

pytestmark = pytest.mark.timeout(120)

COLUMNS = ("run_id", "status", "run_class", "started_at", "ended_at", "duration_ms", "events", "last_sequence", "cost_cents",
           "input_tokens", "output_tokens", "refusals", "retries", "failures", "violations", "flags", "replays",
           "last_verdict", "replays_not_matching")


def runs(store, **params):
    return run_named(store, "runs", {k: str(v) for k, v in params.items()})


def test_columns_and_params_are_the_fixed_interface():
    assert [p.name for p in NAMED_QUERIES["runs"].params] == [
        "since", "until", "status", "model", "flagged", "verdict", "search", "run_class", "limit", "offset"]


def test_every_run_newest_first_with_its_figures(loaded_store):
    result = runs(loaded_store)
    assert result.columns == COLUMNS
    got = {r["run_id"]: r for r in result.to_dicts()}
    assert set(got) == {"run-1", LLM_RUN, *child_runs("run-1")}
    assert result.to_dicts()[0]["run_id"] == LLM_RUN  # started an hour after run-1
    one = got["run-1"]
    assert (one["status"], one["events"], one["last_sequence"], one["duration_ms"]) == ("completed", 20, 19, 19_000)
    assert one["ended_at"] is not None and one["ended_at"].second == 19
    assert (one["failures"], one["violations"], one["replays"], one["replays_not_matching"]) == (2, 1, 2, 1)
    assert one["last_verdict"] == "diverged_at_refusal"
    assert sorted(one["flags"]) == ["handoff_failed", "violations"]
    llm = got[LLM_RUN]
    assert (llm["refusals"], llm["cost_cents"], llm["input_tokens"], llm["output_tokens"]) == (3, 1.75, 160, 25)
    assert llm["flags"] == ["refused"] and llm["replays"] == 0 and llm["last_verdict"] == ""


def test_filters(loaded_store):
    def ids(**params):
        return [r[0] for r in runs(loaded_store, **params).rows]

    assert ids(model="gpt-y") == [LLM_RUN]
    assert ids(verdict="diverged_at_refusal") == ["run-1"]
    assert set(ids(flagged=1)) == {"run-1", LLM_RUN}
    assert ids(since="2025-01-15T10:30:00Z") == [LLM_RUN]
    assert LLM_RUN not in ids(until="2025-01-15T10:30:00Z")
    status_of = {r["run_id"]: r["status"] for r in runs(loaded_store).to_dicts()}
    assert set(ids(status="completed")) == {r for r, s in status_of.items() if s == "completed"} >= {"run-1", LLM_RUN}
    assert ids(status="no-such-status") == []
    assert len(ids(limit=1)) == 1 and ids(limit=1, offset=1) == ids()[1:2]


def test_a_malformed_time_or_flag_is_a_clear_error(loaded_store):
    with pytest.raises(StoreError, match="ISO 8601") as e:
        runs(loaded_store, since="yesterday")
    assert e.value.code == "bad_param"
    with pytest.raises(StoreError, match="0 or 1"):
        runs(loaded_store, flagged=2)


def test_usage_over_time_buckets_what_usage_sums(loaded_store):
    got = run_named(loaded_store, "usage-over-time", {"bucket_s": "3600"}).to_dicts()
    assert sorted({r["bucket"].hour for r in got}) == [10, 11]  # run-1 at 10:00, run-llm at 11:00
    per_model = run_named(loaded_store, "usage").to_dicts()
    assert sum(r["calls"] for r in got) == sum(r["calls"] for r in per_model)
    assert round(sum(r["cost_cents"] for r in got), 4) == round(sum(r["cost_cents"] for r in per_model), 4)
    assert {r["model"] for r in got if r["bucket"].hour == 11} == {"claude-x", "gpt-y", "m-small"}
    later = run_named(loaded_store, "usage-over-time", {"since": "2025-01-15T10:30:00Z"}).to_dicts()
    assert {r["bucket"].hour for r in later} == {11}


def test_the_last_verdict_is_the_replay_that_started_last(loaded_store):
    # Both verdicts of run-1 were written in one batch (same recorded_at); once the replays' own
    # events are stored, the one that started later decides, whatever its id sorts as.
    def started(run_id: str, ts: str) -> dict:
        return {"eventId": f"{run_id}:0", "runId": run_id, "type": "run.started", "payload": {},
                "timestamp": ts, "sequence": 0, "nodeId": "host"}

    loaded_store.insert_records("committed", committed([started("run-1.replay-2", "2025-01-15T12:00:00.000Z")])
                                + committed([started("run-1.replay-1", "2025-01-15T12:05:00.000Z")], partition=1))
    one = next(r for r in runs(loaded_store).to_dicts() if r["run_id"] == "run-1")
    assert one["last_verdict"] == "match"
