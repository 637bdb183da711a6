"""Every named query against the realistic scenario; expected values are worked out from the story.

tests/unit/core/runs.py: run-1 (check mode) has one event per second from 10:00:00; the
transitions below are at those seconds. tests/unit/audit/data.py: run-llm's LLM calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentlog.audit.queries import NAMED_QUERIES, AuditQueries, run_named, run_sql
from agentlog.schemas.errors import StoreError
from tests.unit.audit.data import audit_batches
from tests.unit.core.runs import realistic_run

pytestmark = pytest.mark.timeout(120)

RUN1_TYPES = [
    "run.started", "variable.changed", "runOrchestrator.decided", "provider.usage",
    "core.workflowChain.event", "core.workflowChain.event", "node.dispatched",
    "core.workflowChain.event", "core.workflowChain.event", "channel.written",
    "core.workflowChain.event", "core.workflowChain.event", "variable.changed",
    "runOrchestrator.decided", "core.workflowChain.event", "core.workflowChain.event",
    "node.dispatched", "core.workflowChain.event", "channel.written", "run.completed",
]


def rows(store, name, **params):
    return run_named(store, name, {k: str(v) for k, v in params.items()}).to_dicts()


def test_run_timeline_is_the_run_in_sequence_order(loaded_store):
    got = rows(loaded_store, "run-timeline", run_id="run-1")
    assert [r["sequence"] for r in got] == list(range(20))
    assert [r["type"] for r in got] == RUN1_TYPES
    assert [r["event_id"] for r in got] == [f"run-1:{i:04d}" for i in range(20)]
    assert got[5]["causation_id"] == "run-1:0004" and got[0]["causation_id"] == ""
    assert got[7]["event_time"].second == 7 and got[7]["event_time"].hour == 10
    assert rows(loaded_store, "run-timeline", run_id="run-1", limit=3)[-1]["sequence"] == 2
    assert rows(loaded_store, "run-timeline", run_id="no-such-run") == []


def test_causation_chain_walks_both_ways(loaded_store):
    got = rows(loaded_store, "causation-chain", run_id="run-1", event_id="run-1:0005")
    # 5 = dispatch.succeeded A: caused by 4 (began A) <- 2 (decided) <- 1 (goal);
    # it causes 6 (node.dispatched) and 10 (child.completed) -> 11 (harvest) -> 12 (parentResult).
    assert [(r["relation"], r["sequence"], r["depth"]) for r in got] == [
        ("ancestor", 1, 3), ("ancestor", 2, 2), ("ancestor", 4, 1), ("self", 5, 0),
        ("descendant", 6, 1), ("descendant", 10, 1), ("descendant", 11, 2), ("descendant", 12, 3),
    ]
    decided = rows(loaded_store, "causation-chain", run_id="run-1", event_id="run-1:0002")
    assert {r["sequence"] for r in decided if r["relation"] == "descendant"} == {4, 5, 6, 7, 8, 10, 11, 12}
    bounded = rows(loaded_store, "causation-chain", run_id="run-1", event_id="run-1:0002", max_depth=1)
    assert {r["sequence"] for r in bounded if r["relation"] == "descendant"} == {4, 7}
    # same event id in another run does not leak in
    assert rows(loaded_store, "causation-chain", run_id="run-llm", event_id="run-1:0005") == []


def test_handoff_latency_per_worker_and_phase(loaded_store):
    got = {(r["worker_id"], r["phase"]): (r["n"], r["p50_ms"], r["p95_ms"], r["p99_ms"])
           for r in rows(loaded_store, "handoff-latency", run_id="run-1")}
    assert got == {
        ("worker-a", "dispatch.succeeded"): (1, 1000, 1000, 1000),   # 4 -> 5
        ("worker-a", "child.completed"): (1, 5000, 5000, 5000),      # 5 -> 10
        ("worker-a", "output.harvested"): (1, 1000, 1000, 1000),     # 10 -> 11
        ("worker-b", "dispatch.failed"): (1, 1000, 1000, 1000),      # 7 -> 8
        ("worker-c", "dispatch.succeeded"): (1, 1000, 1000, 1000),   # 14 -> 15
        ("worker-c", "child.cancelled"): (1, 2000, 2000, 2000),      # 15 -> 17
    }


def test_handoff_latency_percentiles_interpolate(store):
    base = {"parentRunId": "run-z", "workerId": "worker-z", "childRunId": None, "causationId": None,
            "derived": True, "harvestedKeys": None, "error": None, "sequence": None}
    recs = []
    for k in range(1, 6):  # five dispatches, 100..500 ms from began to succeeded
        d = f"d{k}"
        recs.append({**base, "dispatchId": d, "phase": "dispatch.began", "from": "pending", "to": "dispatching",
                     "eventId": f"{d}-0", "timestamp": f"2025-01-15T10:00:0{k}.000Z"})
        recs.append({**base, "dispatchId": d, "phase": "dispatch.succeeded", "from": "dispatching", "to": "running",
                     "eventId": f"{d}-1", "timestamp": f"2025-01-15T10:00:0{k}.{k}00Z"})
    store.insert_records("transition", recs)
    (row,) = rows(store, "handoff-latency")
    # linear interpolation over [100..500]: p50 = 300, p95 at rank 3.8 = 480, p99 at rank 3.96 = 496
    assert (row["worker_id"], row["phase"], row["n"]) == ("worker-z", "dispatch.succeeded", 5)
    assert (row["p50_ms"], row["p95_ms"], row["p99_ms"], row["max_ms"]) == (300, 480, 496, 500)


def test_failures_by_worker_and_code(loaded_store):
    got = {(r["worker_id"], r["phase"], r["error_code"]): (r["failures"], r["dispatches"], r["failure_rate"])
           for r in rows(loaded_store, "failures")}
    assert got == {
        ("worker-b", "dispatch.failed", "worker_unavailable"): (1, 1, 1.0),
        ("worker-c", "child.cancelled", "cancelled"): (1, 1, 1.0),
    }


def test_refusal_rate_per_model(loaded_store):
    got = {(r["provider"], r["model"]): (r["completed"], r["refused"], r["refusal_rate"])
           for r in rows(loaded_store, "refusals")}
    # claude-x: k1 completed, k2 refused, k1 refused again (paired with the later start at 9);
    # the orphan refusal (no start) gets its model from the provider.usage it caused.
    assert got == {
        ("anthropic", "claude-x"): (1, 2, round(2 / 3, 4)),
        ("openai", "gpt-y"): (1, 0, 0.0),
        ("mistral", "m-small"): (0, 1, 1.0),
    }
    assert rows(loaded_store, "refusals", run_id="run-1") == []


def test_usage_per_run_and_model(loaded_store):
    got = {(r["run_id"], r["provider"], r["model"]): (r["calls"], r["input_tokens"], r["output_tokens"], r["cost_cents"])
           for r in rows(loaded_store, "usage")}
    assert got == {
        ("run-1", "anthropic", "claude-x"): (1, 812, 95, 0),
        ("run-llm", "anthropic", "claude-x"): (1, 100, 20, 1.5),
        ("run-llm", "openai", "gpt-y"): (1, 50, 5, 0.25),
        ("run-llm", "mistral", "m-small"): (1, 10, 0, 0),
    }
    assert {r["run_id"] for r in rows(loaded_store, "usage", run_id="run-llm")} == {"run-llm"}


def test_replay_verdicts_and_filters(loaded_store):
    got = rows(loaded_store, "replay-verdicts", source_run_id="run-1")
    assert {(r["replay_run_id"], r["verdict"], r["compared_through"]) for r in got} == {
        ("run-1.replay-1", "match", 19), ("run-1.replay-2", "diverged_at_refusal", 7)}
    only = rows(loaded_store, "replay-verdicts", verdict="diverged_at_refusal")
    assert [(r["error_code"], r["first_divergence"]) for r in only] == [
        ("replay_diverged_at_refusal", '{"atSequence":7}')]


def test_rejections_by_reason(loaded_store):
    got = {r["reason"]: (r["rejections"], r["runs"]) for r in rows(loaded_store, "rejections")}
    assert got == {"sequence_gap": (2, 1), "decode_error": (1, 0), "dangling_causation": (1, 1)}
    assert {r["reason"]: r["rejections"] for r in rows(loaded_store, "rejections", run_id="run-1")} == {
        "sequence_gap": 2}


def test_violations_by_code(loaded_store):
    assert [(r["run_id"], r["code"], r["violations"]) for r in rows(loaded_store, "violations")] == [
        ("run-1", "wrong_causation", 1)]


AUDIT_TABLES = ("events", "transitions", "violations", "rejections", "snapshots", "replay_verdicts")


def _counts(store) -> dict[str, int]:
    return {t: run_sql(store, f"SELECT count() FROM {t}").rows[0][0] for t in AUDIT_TABLES}


def test_redelivered_batches_never_show_twice(loaded_store):
    before = {name: run_named(loaded_store, name, _params(name)).rows for name in NAMED_QUERIES}
    counts = _counts(loaded_store)
    assert counts["events"] == len(audit_batches()["committed"])
    for _ in range(2):  # the sink crashed after inserting, twice: it re-forms the same batches, same tokens
        for kind, records in audit_batches().items():
            loaded_store.insert_records(kind, records, dedup_token=f"fixture:{kind}")
    after = {name: run_named(loaded_store, name, _params(name)).rows for name in NAMED_QUERIES}
    for name in NAMED_QUERIES:
        assert after[name] == before[name], name
    assert _counts(loaded_store) == counts  # plain count(), no FINAL, every table
    rollup = run_sql(loaded_store, "SELECT sum(calls) FROM usage_hourly").rows[0][0]
    assert rollup == sum(1 for r in audit_batches()["committed"] if r["doc"]["type"] == "provider.usage")


def test_a_batch_without_its_token_is_stored_twice(loaded_store):
    """The counterpart of the test above: dedup comes from the token, not from the table's key."""
    loaded_store.insert_records("committed", audit_batches()["committed"], dedup_token="another-range")
    assert _counts(loaded_store)["events"] == 2 * len(audit_batches()["committed"])


def test_no_named_query_or_reader_uses_final():
    import agentlog.audit.queries as q
    import agentlog.audit.report as report
    import agentlog.audit.server as server
    import agentlog.console.views as console_views

    for name, query in NAMED_QUERIES.items():
        assert not re.search(r"\bFINAL\b", query.sql, re.I), name
    for mod in (server, report, console_views):
        assert not re.search(r"\bFINAL\b", Path(mod.__file__).read_text()), mod.__name__
    assert q.__doc__ and "FINAL" in q.__doc__  # the module says why; only its docstring names it


def _params(name: str) -> dict[str, str]:
    return {"run-timeline": {"run_id": "run-1"},
            "causation-chain": {"run_id": "run-1", "event_id": "run-1:0005"},
            "suite-runs": {"execution": "x"}}.get(name, {})


INJECTIONS = [
    "' OR 1=1 --",
    "x'); DROP TABLE events; --",
    "run-1' OR '1'='1",
    "run-1\u2019 OR \u20181\u2019=\u20181",  # unicode quotes
    "run-1\\' OR 1=1 --",
    "run-1%27%20OR%201=1",
    "{run_id:String}",
]


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_through_params_finds_nothing_and_breaks_nothing(loaded_store, payload):
    assert rows(loaded_store, "run-timeline", run_id=payload) == []
    assert rows(loaded_store, "causation-chain", run_id="run-1", event_id=payload) == []
    assert rows(loaded_store, "usage", run_id=payload) == []
    assert rows(loaded_store, "rejections", run_id=payload) == []
    assert len(rows(loaded_store, "run-timeline", run_id="run-1")) == 20
    tables = {r[0] for r in run_sql(loaded_store, "SHOW TABLES").rows}
    assert {"events", "transitions", "rejections", "replay_verdicts"} <= tables


@pytest.mark.parametrize("bad", ["1; DROP TABLE events", "-1", "1 OR 1=1", "", "1e3", "99999999999999999999"])
def test_numeric_params_are_validated(loaded_store, bad):
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "run-timeline", {"run_id": "run-1", "limit": bad})
    assert e.value.code == "bad_param"


def test_unknown_query_and_params(loaded_store):
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "drop-everything", {})
    assert e.value.code == "unknown_query"
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "run-timeline", {})
    assert e.value.code == "bad_param" and "run_id" in str(e.value)
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "usage", {"run_id": "run-1", "tenant": "x"})
    assert e.value.code == "bad_param" and "tenant" in str(e.value)


@pytest.mark.parametrize("stmt", [
    "INSERT INTO events (run_id) VALUES ('x')",
    "ALTER TABLE events DELETE WHERE 1",
    "DROP TABLE events",
    "CREATE TABLE evil (a UInt8) ENGINE = Memory",
    "TRUNCATE TABLE events",
    "RENAME TABLE events TO e2",
    "OPTIMIZE TABLE events FINAL",
    "SYSTEM DROP MARK CACHE",
    "KILL QUERY WHERE 1",
    "SET max_threads = 1",
    "  -- a comment\n  drop table events",
    "/* SELECT */ DROP TABLE events",
    "SELECT 1; DROP TABLE events",
    "select 1 ; select 2",
])
def test_sql_is_read_only(loaded_store, stmt):
    with pytest.raises(StoreError) as e:
        run_sql(loaded_store, stmt)
    assert e.value.code == "read_only"
    assert run_sql(loaded_store, "SELECT count() FROM events").rows[0][0] == len(audit_batches()["committed"])


def test_server_side_readonly_backs_the_parser(loaded_store):
    # Passes the keyword check, refused by readonly=1 on the engine (code 164): no file reads.
    with pytest.raises(StoreError) as e:
        run_sql(loaded_store, "SELECT * FROM file('/etc/hostname', 'LineAsString')")
    assert e.value.code == "read_only" and "164" in str(e.value)


def test_sql_reads_and_keeps_server_error_codes(loaded_store):
    r = run_sql(loaded_store, "SELECT type, count() AS n FROM events WHERE run_id = 'run-1' "
                              "AND type = 'core.workflowChain.event' GROUP BY type;")
    assert r.rows == [("core.workflowChain.event", sum(1 for d in realistic_run() if d["type"] == r.rows[0][0]))]
    with pytest.raises(StoreError) as e:
        run_sql(loaded_store, "SELECT nosuchcolumn FROM events")
    assert e.value.code == "clickhouse_error"
    assert e.value.server_code == 47 and e.value.server_name == "UNKNOWN_IDENTIFIER"
    assert "Code: 47" in str(e.value)


def test_python_api(loaded_store):
    q = AuditQueries(loaded_store)
    assert len(q.run_timeline("run-1").rows) == 20
    assert {r["relation"] for r in q.causation_chain("run-1", "run-1:0005").to_dicts()} == {
        "ancestor", "self", "descendant"}
    df = q.usage().to_dataframe()
    assert int(df["input_tokens"].sum()) == 812 + 100 + 50 + 10


def test_runs_lists_each_run_from_its_events(loaded_store):
    """Every column checked against the input docs, computed here without the store."""
    by_run: dict[str, list[dict]] = {}
    for rec in audit_batches()["committed"]:
        by_run.setdefault(rec["doc"]["runId"], []).append(rec["doc"])
    got = {r["run_id"]: r for r in rows(loaded_store, "runs")}
    assert set(got) == set(by_run)
    for run_id, docs in by_run.items():
        row = got[run_id]
        assert row["events"] == len(docs), run_id
        assert row["last_sequence"] == max(d["sequence"] for d in docs)
        run_types = [d["type"] for d in sorted(docs, key=lambda d: d["sequence"]) if d["type"].startswith("run.")]
        assert row["status"] == (run_types[-1][4:] if run_types else "unknown"), run_id
        usage = [d["payload"] for d in docs if d["type"] == "provider.usage"]
        assert row["input_tokens"] == sum(p["inputTokens"] for p in usage)
        assert row["cost_cents"] == pytest.approx(sum(p.get("costCents", 0) for p in usage))
        assert row["refusals"] == sum(d["type"] == "envelope.refusal" for d in docs)
        assert ("refused" in row["flags"]) == (row["refusals"] > 0)
    verdicts = [v for v in audit_batches()["verdict"] if v["sourceRunId"] == "run-1"]
    assert got["run-1"]["replays"] == len(verdicts)
    assert got["run-1"]["replays_not_matching"] == sum(v["verdict"] != "match" for v in verdicts)
    assert got["run-1"]["violations"] == 1 and "violations" in got["run-1"]["flags"]
    # paging and the time window
    first = run_named(loaded_store, "runs", {"limit": "1"}).to_dicts()
    second = run_named(loaded_store, "runs", {"limit": "1", "offset": "1"}).to_dicts()
    assert len(first) == 1 and len(second) == min(1, len(by_run) - 1) and first != second
    assert run_named(loaded_store, "runs", {"since": "2299-01-01T00:00:00Z"}).rows == []
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "runs", {"since": "yesterday"})
    assert e.value.code == "bad_param"


def test_runs_shows_and_filters_by_run_class(store):
    batches = audit_batches()
    for rec in batches["committed"]:
        if rec["doc"]["type"] == "run.started" and rec["doc"]["runId"] == "run-1":
            rec["doc"]["payload"] = {**rec["doc"]["payload"], "runClass": "ci"}
    store.insert_records("committed", batches["committed"], dedup_token="classes")
    every = {r["run_id"]: r["run_class"] for r in rows(store, "runs")}
    assert every["run-1"] == "ci" and {c for r, c in every.items() if r != "run-1"} == {""}
    assert [r["run_id"] for r in rows(store, "runs", run_class="ci")] == ["run-1"]
    assert rows(store, "runs", run_class="prod") == []


def test_runs_filters_by_model_flags_and_last_verdict_before_paging(loaded_store):
    """The console's filters: model used, flagged only, last replay verdict; paging applies after them."""
    models: dict[str, set[str]] = {}
    for rec in audit_batches()["committed"]:
        if rec["doc"]["type"] == "provider.usage":
            models.setdefault(rec["doc"]["payload"]["model"], set()).add(rec["doc"]["runId"])
    assert len(models) >= 2
    for model, expected in models.items():
        assert {r["run_id"] for r in rows(loaded_store, "runs", model=model)} == expected, model
    assert rows(loaded_store, "runs", model="no-such-model") == []

    every = rows(loaded_store, "runs")
    flagged = [r["run_id"] for r in every if r["flags"]]
    assert 0 < len(flagged) < len(every)  # the filter has something to keep and something to drop
    assert [r["run_id"] for r in rows(loaded_store, "runs", flagged="1")] == flagged
    assert [r["run_id"] for r in rows(loaded_store, "runs", flagged="1", limit="1", offset="1")] == flagged[1:2]

    by_source: dict[str, list[dict]] = {}
    for v in audit_batches()["verdict"]:
        by_source.setdefault(v["sourceRunId"], []).append(v)
    last = {run: max(vs, key=lambda v: v["replayRunId"])["verdict"] for run, vs in by_source.items()}
    for verdict in {"match", "diverged_at_refusal"}:
        expected = sorted(run for run, v in last.items() if v == verdict)
        assert sorted(r["run_id"] for r in rows(loaded_store, "runs", verdict=verdict)) == expected, verdict
    assert any(last.values())
    assert list(every[0]) == ["run_id", "status", "run_class", "started_at", "ended_at", "duration_ms", "events",
                              "last_sequence", "cost_cents", "input_tokens", "output_tokens", "refusals",
                              "retries", "failures", "violations", "flags", "replays", "last_verdict",
                              "replays_not_matching"]
    with pytest.raises(StoreError) as e:
        run_named(loaded_store, "runs", {"flagged": "256"})
    assert e.value.code == "bad_param"


def test_runs_searches_run_ids_as_you_type(loaded_store):
    """The compare page's run picker: runs whose id contains what was typed, any case, newest first."""
    every = [r["run_id"] for r in rows(loaded_store, "runs")]
    assert len(every) >= 2
    for typed in {every[0][-3:], every[-1][:4].upper(), every[0]}:
        expected = [run for run in every if typed.lower() in run.lower()]
        assert expected
        assert [r["run_id"] for r in rows(loaded_store, "runs", search=typed)] == expected, typed
    assert rows(loaded_store, "runs", search="no such run id") == []
    assert [r["run_id"] for r in rows(loaded_store, "runs", search=every[0][:2], limit="1")] == [
        next(run for run in every if every[0][:2].lower() in run.lower())]
