"""Named queries that read rollups or walk arrays, against straightforward reference SQL over the same data.

handoff-latency and failures read rollups kept by views on ``transitions`` (migration 0005), and
causation-chain walks arrays instead of a recursive CTE. Each is compared here with the
straightforward query (a window over ``transitions``, a recursive CTE), kept below as the reference,
on data generated in the shapes that matter: transitions inserted in many batches and out of order
(a dispatch's later phase stored before its earlier one), and causation trees that are binary,
linear chains or random.
"""

from __future__ import annotations

import random

import pytest

from agentlog.audit.queries import run_named
from agentlog.audit.rollups import repair

pytestmark = pytest.mark.timeout(300)

_RANK = """multiIf(
    phase = 'dispatch.began', 0,
    phase IN ('dispatch.succeeded', 'dispatch.failed'), 1,
    phase IN ('child.completed', 'child.failed', 'child.cancelled'), 2,
    phase = 'output.harvested', 3,
    9)"""

# The reference queries without the rollups (a window over every transition).
REF_HANDOFF_LATENCY = f"""
WITH steps AS (
    SELECT worker_id, phase, {_RANK} AS phase_rank,
        toUnixTimestamp64Milli(event_time) - lagInFrame(toUnixTimestamp64Milli(event_time)) OVER w AS ms,
        row_number() OVER w AS step
    FROM transitions
    WHERE ({{run_id:String}} = '' OR parent_run_id = {{run_id:String}})
    WINDOW w AS (PARTITION BY parent_run_id, dispatch_id ORDER BY phase_rank, event_time
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT worker_id, phase, count() AS n,
    round(quantileExactInclusive(0.5)(ms), 3) AS p50_ms, round(quantileExactInclusive(0.95)(ms), 3) AS p95_ms,
    round(quantileExactInclusive(0.99)(ms), 3) AS p99_ms, max(ms) AS max_ms
FROM steps WHERE step > 1
GROUP BY worker_id, phase, phase_rank
ORDER BY worker_id, phase_rank, phase
"""

REF_FAILURES = """
WITH t AS (
    SELECT worker_id, dispatch_id, phase, error_code, parent_run_id FROM transitions
    WHERE ({run_id:String} = '' OR parent_run_id = {run_id:String})
),
per_worker AS (SELECT worker_id, uniqExact(dispatch_id) AS dispatches FROM t GROUP BY worker_id)
SELECT t.worker_id AS worker_id, t.phase AS phase, if(t.error_code = '', '(none)', t.error_code) AS error_code,
    count() AS failures, uniqExact(t.parent_run_id) AS runs, any(per_worker.dispatches) AS dispatches,
    round(failures / dispatches, 4) AS failure_rate
FROM t INNER JOIN per_worker ON t.worker_id = per_worker.worker_id
WHERE t.phase IN ('dispatch.failed', 'child.failed', 'child.cancelled')
GROUP BY worker_id, phase, error_code
ORDER BY failures DESC, worker_id, phase, error_code
"""

REF_CAUSATION_CHAIN = """
WITH RECURSIVE
    ev AS (SELECT event_id, causation_id, sequence, type, node_id FROM events WHERE run_id = {run_id:String}),
    up AS (
        SELECT event_id, causation_id, sequence, type, node_id, toUInt32(0) AS depth
        FROM ev WHERE event_id = {event_id:String}
        UNION ALL
        SELECT ev.event_id, ev.causation_id, ev.sequence, ev.type, ev.node_id, up.depth + 1
        FROM ev INNER JOIN up ON ev.event_id = up.causation_id
        WHERE up.causation_id != '' AND up.depth < {max_depth:UInt32}
    ),
    down AS (
        SELECT event_id, causation_id, sequence, type, node_id, toUInt32(0) AS depth
        FROM ev WHERE event_id = {event_id:String}
        UNION ALL
        SELECT ev.event_id, ev.causation_id, ev.sequence, ev.type, ev.node_id, down.depth + 1
        FROM ev INNER JOIN down ON ev.causation_id = down.event_id
        WHERE down.depth < {max_depth:UInt32}
    )
SELECT relation, depth, sequence, event_id, causation_id, type, node_id
FROM (
    SELECT 'ancestor' AS relation, depth, sequence, event_id, causation_id, type, node_id FROM up WHERE depth > 0
    UNION ALL
    SELECT 'self', depth, sequence, event_id, causation_id, type, node_id FROM up WHERE depth = 0
    UNION ALL
    SELECT 'descendant', depth, sequence, event_id, causation_id, type, node_id FROM down WHERE depth > 0
)
ORDER BY sequence
"""

_PHASES = {  # phase -> (from, to); a dispatch takes one path
    "dispatch.began": ("pending", "dispatching"), "dispatch.succeeded": ("dispatching", "running"),
    "dispatch.failed": ("dispatching", "failed"), "child.completed": ("running", "completed"),
    "child.failed": ("running", "failed"), "child.cancelled": ("running", "cancelled"),
    "output.harvested": ("completed", "harvested"),
}
_PATHS = [
    ["dispatch.began", "dispatch.succeeded", "child.completed", "output.harvested"],
    ["dispatch.began", "dispatch.failed"],
    ["dispatch.began", "dispatch.succeeded", "child.failed"],
    ["dispatch.began", "dispatch.succeeded", "child.cancelled"],
    ["dispatch.succeeded", "child.completed"],  # began never seen: the first stored phase has no step
]


def _transitions(rng: random.Random, runs: int = 12, dispatches: int = 6) -> list[dict]:
    out = []
    for r in range(runs):
        for d in range(dispatches):
            worker = f"worker-{rng.randrange(4)}"
            ms = 1_700_000_000_000 + r * 10_000_000 + d * 100_000
            for phase in rng.choice(_PATHS):
                ms += rng.choice([0, 0, 1, 7, 250, 1_000, 5_003])  # ties and a clock that does not move
                frm, to = _PHASES[phase]
                out.append({
                    "parentRunId": f"run-{r}", "dispatchId": f"d{d}", "phase": phase, "workerId": worker,
                    "childRunId": None, "from": frm, "to": to, "eventId": f"run-{r}:d{d}:{phase}",
                    "causationId": None, "sequence": None, "derived": True, "harvestedKeys": None,
                    "error": ({"code": rng.choice(["worker_unavailable", "timeout", "cancelled"]), "message": "x"}
                              if phase.endswith(("failed", "cancelled")) and rng.random() < 0.8 else None),
                    "timestamp": _iso(ms),
                })
    return out


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _same(store, name: str, reference: str, params: dict) -> list[tuple]:
    got = run_named(store, name, params).rows
    want = store.query(reference, params).rows
    assert got == want, (name, params)
    return got


def test_handoff_rollups_answer_like_the_window_over_transitions_even_out_of_order(store):
    rng = random.Random(14)
    recs = _transitions(rng)
    rng.shuffle(recs)  # a dispatch's phases arrive in any order, across many inserts
    for i in range(0, len(recs), 7):
        store.insert_records("transition", recs[i:i + 7])
    assert store.query("SELECT countIf(weight < 0) FROM handoff_steps").rows[0][0] > 0  # corrections happened
    for run in ("", "run-3", "run-7", "no-such-run"):
        _same(store, "handoff-latency", REF_HANDOFF_LATENCY, {"run_id": run})
        _same(store, "failures", REF_FAILURES, {"run_id": run})
    assert len(_same(store, "handoff-latency", REF_HANDOFF_LATENCY, {"run_id": ""})) > 8
    assert len(_same(store, "failures", REF_FAILURES, {"run_id": ""})) > 4


def test_transition_rollups_short_of_a_batch_are_repaired_once(store):
    rng = random.Random(3)
    recs = _transitions(rng, runs=6)
    half = len(recs) // 2
    store.insert_records("transition", recs[:half])
    views = ("handoff_steps_mv", "worker_failures_mv", "worker_dispatches_mv")
    for view in views:
        store.command(f"DETACH TABLE {view}")
    store.insert_records("transition", recs[half:])  # the views never see it (a SIGKILL in between)
    for view in views:
        store.command(f"ATTACH TABLE {view}")
    runs = sorted({r["parentRunId"] for r in recs})
    with pytest.raises(AssertionError):
        _same(store, "handoff-latency", REF_HANDOFF_LATENCY, {"run_id": ""})
    short = repair(store, runs, source="transitions")
    assert set(short) == {"handoff_steps"} and short["handoff_steps"] > 0
    for run in ("", runs[-1]):
        _same(store, "handoff-latency", REF_HANDOFF_LATENCY, {"run_id": run})
        _same(store, "failures", REF_FAILURES, {"run_id": run})
    assert repair(store, runs, source="transitions") == {}  # a second repair adds nothing
    _same(store, "handoff-latency", REF_HANDOFF_LATENCY, {"run_id": ""})
    _same(store, "failures", REF_FAILURES, {"run_id": ""})
    with pytest.raises(ValueError):
        repair(store, runs, source="violations")


_GEN_EVENTS = """
INSERT INTO events (run_id, sequence, event_id, causation_id, type, node_id, event_time, ingested_at, source_topic,
                    kafka_partition, kafka_offset, hash, prev_hash, payload, doc)
SELECT {run:String} AS run_id, number AS seq, concat(run_id, ':', toString(seq)) AS event_id,
       multiIf(seq = 0, '',
               {shape:String} = 'binary', concat(run_id, ':', toString(intDiv(seq - 1, 2))),
               {shape:String} = 'chain', concat(run_id, ':', toString(seq - 1)),
               cityHash64(seq) % 5 = 0, '',                                          -- a new root
               cityHash64(seq) % 7 = 0, concat('other:', toString(seq - 1)),         -- a cause not in the run
               concat(run_id, ':', toString(cityHash64(seq, 1) % seq))) AS causation_id,
       'variable.changed', concat('node-', toString(seq % 3)), toDateTime64('2025-01-01 00:00:00', 3, 'UTC'),
       toDateTime64('2025-01-01 00:00:00', 3, 'UTC'), 't', 0, toInt64(seq), '', '', '{}', '{}'
FROM numbers({n:UInt64})
"""


@pytest.mark.parametrize(("shape", "n"), [("binary", 300), ("chain", 120), ("random", 400)])
def test_causation_chain_answers_like_the_recursive_walk(store, shape, n):
    for run in ("run-a", "run-b"):  # a second run with the same shape: its ids must not leak in
        store.command(_GEN_EVENTS, {"run": run, "shape": shape, "n": n})
    rng = random.Random(n)
    for seq in [0, 1, n // 2, n - 1, *rng.sample(range(n), 6)]:
        for max_depth in ("1000", "3", "1"):
            params = {"run_id": "run-a", "event_id": f"run-a:{seq}", "max_depth": max_depth}
            got = _same(store, "causation-chain", REF_CAUSATION_CHAIN, params)
            assert any(r[0] == "self" for r in got)
    for missing in ({"run_id": "run-a", "event_id": "run-b:3"}, {"run_id": "no-run", "event_id": "run-a:3"}):
        assert _same(store, "causation-chain", REF_CAUSATION_CHAIN, {**missing, "max_depth": "1000"}) == []


REF_USAGE_OVER_TIME = """
SELECT toStartOfInterval(event_time, toIntervalSecond({bucket_s:UInt32})) AS bucket, provider, model,
    count() AS calls, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
    round(sum(cost_cents), 4) AS cost_cents
FROM events
WHERE type = 'provider.usage'
  AND ({since:String} = '' OR event_time >= parseDateTime64BestEffortOrZero({since:String}, 3, 'UTC'))
GROUP BY bucket, provider, model
ORDER BY bucket, provider, model
"""

_GEN_USAGE = """
INSERT INTO events (run_id, sequence, event_id, causation_id, type, node_id, event_time, ingested_at, source_topic,
                    kafka_partition, kafka_offset, hash, prev_hash, payload, doc)
SELECT concat('run-', toString(intDiv(number, 100))) AS run_id, number % 100 AS seq,
       concat(run_id, ':', toString(seq)), '', if(number % 3 = 0, 'provider.usage', 'variable.changed'), 'n',
       toDateTime64('2025-01-01 00:00:00', 3, 'UTC') + toIntervalMillisecond(number * 7919),
       toDateTime64('2025-01-01 00:00:00', 3, 'UTC'), 't', 0, toInt64(number), '', '',
       concat('{"costCents":', toString((number % 50) / 8), ',"inputTokens":', toString(100 + number % 900),
              ',"model":"model-', toString(number % 4), '","outputTokens":', toString(number % 200),
              ',"provider":"p', toString(number % 2), '"}'), '{}'
FROM numbers({from:UInt64}, {n:UInt64})
"""


def test_usage_over_time_from_the_rollup_answers_like_the_scan_of_events(store):
    for part in range(3):  # several inserts: the rollup holds one row per insert and hour
        store.command(_GEN_USAGE, {"from": part * 2000, "n": 2000})
    for bucket in ("3600", "7200", "86400", "60", "5400"):
        for since in ("", "2025-01-01T03:00:00Z", "2025-01-01T03:17:45.5Z", "2025-01-01T02:59:59.999+00:00",
                      "2030-01-01T00:00:00Z"):
            _same(store, "usage-over-time", REF_USAGE_OVER_TIME, {"bucket_s": bucket, "since": since})
    assert len(_same(store, "usage-over-time", REF_USAGE_OVER_TIME, {"bucket_s": "3600", "since": ""})) > 20
