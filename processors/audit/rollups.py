"""Repair of the rollups after a SIGKILL in the middle of a sink insert.

``usage_hourly`` and ``run_rollup`` are views over ``events``; ``handoff_steps``, ``worker_failures``
and ``worker_dispatches`` (migration 0005) are views over ``transitions``.

ClickHouse commits an insert's part in ``events`` first and only then runs the materialized views
into the rollups: a SIGKILL in between leaves the events stored and the rollups without them
(seen in 36 of 95 SIGKILLs of a chdb process inserting sink batches). The sink's
re-formed batch finds every event present and would insert nothing, so the rollups would stay
short for good.

So when the sink re-forms a range of the log, it calls :func:`repair` for the runs of that range:
per run (and per usage key), what the view would have produced from ``events`` minus what the
rollup holds, inserted where the rollup holds less. The sums become exact; min, max and argMax
columns take the full aggregate again, which merges to the same value. Nothing happens where the
rollup already agrees, so repairing twice (a crash during the repair) is harmless. A rollup
holding MORE than ``events`` (rows expired by ``events_ttl_days``) is left alone.

``handoff_steps`` holds weighted steps (migration 0005): its repair inserts, per (dispatch, phase, ms),
what the steps recomputed from ``transitions`` weigh minus what the rollup's weights sum to, so it
also corrects a step the views computed before an earlier transition of the dispatch arrived.
``worker_failures`` and ``worker_dispatches`` hold uniqExact sets, which adding the same transitions
again does not change: their repair re-adds the runs' transitions every time, without a check.

The SELECTs mirror the views of migrations 0002 and 0005; ``tests/unit/audit/test_rollups.py`` checks
that a repaired rollup equals the one the views build.
"""

from __future__ import annotations

from processors.audit.store import Store

__all__ = ["ROLLUP_SOURCES", "repair"]

#: Tables whose inserts feed rollups, with the column naming the run a row belongs to.
ROLLUP_SOURCES = {"events": "run_id", "transitions": "parent_run_id"}

_USAGE = """
INSERT INTO usage_hourly (run_id, provider, model, hour, calls, input_tokens, output_tokens, cost_cents)
SELECT t.run_id, t.provider, t.model, t.hour, t.calls - c.calls, t.input_tokens - c.input_tokens,
       t.output_tokens - c.output_tokens, t.cost_cents - c.cost_cents
FROM (
    SELECT run_id, provider, model, toStartOfHour(event_time) AS hour,
           toUInt64(count()) AS calls, sum(input_tokens) AS input_tokens,
           sum(output_tokens) AS output_tokens, sum(cost_cents) AS cost_cents
    FROM events
    WHERE type = 'provider.usage' AND run_id IN {runs:Array(String)}
    GROUP BY run_id, provider, model, hour
) AS t
LEFT JOIN (
    SELECT run_id, provider, model, hour, sum(calls) AS calls, sum(input_tokens) AS input_tokens,
           sum(output_tokens) AS output_tokens, sum(cost_cents) AS cost_cents
    FROM usage_hourly
    WHERE run_id IN {runs:Array(String)}
    GROUP BY run_id, provider, model, hour
) AS c ON t.run_id = c.run_id AND t.provider = c.provider AND t.model = c.model AND t.hour = c.hour
WHERE c.calls < t.calls
"""

_RUN = """
INSERT INTO run_rollup (run_id, started_at, ended_at, events, last_sequence, status, cost_cents,
                        input_tokens, output_tokens, refusals, retries, failures)
SELECT t.run_id, t.started_at, t.ended_at, t.events - c.events, t.last_sequence, t.status,
       t.cost_cents - c.cost_cents, t.input_tokens - c.input_tokens, t.output_tokens - c.output_tokens,
       t.refusals - c.refusals, t.retries - c.retries, t.failures - c.failures
FROM (
    SELECT
        run_id,
        min(event_time) AS started_at,
        max(event_time) AS ended_at,
        toUInt64(count()) AS events,
        max(sequence) AS last_sequence,
        argMaxState(if(startsWith(type, 'run.'), substring(type, 5), ''),
                    if(startsWith(type, 'run.'), sequence + 1, toUInt64(0))) AS status,
        sum(cost_cents) AS cost_cents,
        sum(input_tokens) AS input_tokens,
        sum(output_tokens) AS output_tokens,
        toUInt64(countIf(refusal)) AS refusals,
        toUInt64(countIf(type = 'node.retried')) AS retries,
        toUInt64(countIf(handoff_phase IN ('dispatch.failed', 'child.failed', 'child.cancelled'))) AS failures
    FROM events
    WHERE run_id IN {runs:Array(String)}
    GROUP BY run_id
) AS t
LEFT JOIN (
    SELECT run_id, sum(events) AS events, sum(cost_cents) AS cost_cents, sum(input_tokens) AS input_tokens,
           sum(output_tokens) AS output_tokens, sum(refusals) AS refusals, sum(retries) AS retries,
           sum(failures) AS failures
    FROM run_rollup
    WHERE run_id IN {runs:Array(String)}
    GROUP BY run_id
) AS c ON t.run_id = c.run_id
WHERE c.events < t.events
"""

_SHORT = {
    "usage_hourly": """
SELECT count() FROM (
    SELECT run_id, toUInt64(count()) AS n FROM events
    WHERE type = 'provider.usage' AND run_id IN {runs:Array(String)} GROUP BY run_id
) AS t
LEFT JOIN (
    SELECT run_id, sum(calls) AS n FROM usage_hourly WHERE run_id IN {runs:Array(String)} GROUP BY run_id
) AS c ON t.run_id = c.run_id
WHERE c.n < t.n
""",
    "run_rollup": """
SELECT count() FROM (
    SELECT run_id, toUInt64(count()) AS n FROM events WHERE run_id IN {runs:Array(String)} GROUP BY run_id
) AS t
LEFT JOIN (
    SELECT run_id, sum(events) AS n FROM run_rollup WHERE run_id IN {runs:Array(String)} GROUP BY run_id
) AS c ON t.run_id = c.run_id
WHERE c.n < t.n
""",
}

# Phase rank orders a dispatch's transitions by the state machine, not by clocks: two hosts'
# timestamps may tie or skew, the machine's order cannot. Same expression as migration 0005's view.
_STEPS_OF_RUNS = """
SELECT parent_run_id, dispatch_id, phase, toUInt8(phase_rank) AS phase_rank, worker_id, ms
FROM (
    SELECT parent_run_id, dispatch_id, phase, worker_id,
           multiIf(phase = 'dispatch.began', 0,
                   phase IN ('dispatch.succeeded', 'dispatch.failed'), 1,
                   phase IN ('child.completed', 'child.failed', 'child.cancelled'), 2,
                   phase = 'output.harvested', 3,
                   9) AS phase_rank,
           toUnixTimestamp64Milli(event_time) - lagInFrame(toUnixTimestamp64Milli(event_time)) OVER w AS ms,
           row_number() OVER w AS step
    FROM transitions
    WHERE parent_run_id IN {runs:Array(String)}
    WINDOW w AS (PARTITION BY parent_run_id, dispatch_id ORDER BY phase_rank, event_time
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
WHERE step > 1
"""

# What handoff_steps lacks (weight > 0) or holds in excess (weight < 0) for the runs.
_STEPS_DIFF = f"""
SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, sum(w) AS weight
FROM (
    SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, toInt64(1) AS w FROM ({_STEPS_OF_RUNS})
    UNION ALL
    SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, -weight AS w
    FROM handoff_steps WHERE parent_run_id IN {{runs:Array(String)}}
)
GROUP BY parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms
HAVING weight != 0
"""

_SHORT["handoff_steps"] = f"SELECT uniqExact(parent_run_id) FROM ({_STEPS_DIFF})"

_FAILURES = """
INSERT INTO worker_failures (worker_id, phase, error_code, transitions, runs)
SELECT worker_id, phase, error_code, uniqExactState(parent_run_id, dispatch_id), uniqExactState(parent_run_id)
FROM transitions
WHERE parent_run_id IN {runs:Array(String)} AND phase IN ('dispatch.failed', 'child.failed', 'child.cancelled')
GROUP BY worker_id, phase, error_code
"""

_DISPATCHES = """
INSERT INTO worker_dispatches (worker_id, dispatches)
SELECT worker_id, uniqExactState(dispatch_id) FROM transitions WHERE parent_run_id IN {runs:Array(String)}
GROUP BY worker_id
"""

_REPAIR = {
    "usage_hourly": _USAGE,
    "run_rollup": _RUN,
    "handoff_steps": "INSERT INTO handoff_steps (parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, weight) "
                     + _STEPS_DIFF,
}
_OF_SOURCE = {"events": ("usage_hourly", "run_rollup"), "transitions": ("handoff_steps",)}


def repair(store: Store, run_ids: list[str], *, source: str = "events") -> dict[str, int]:
    """Bring the rollups over ``source`` (``events`` or ``transitions``) of ``run_ids`` up to it.

    Returns, per rollup, how many runs were short (``worker_failures`` and ``worker_dispatches`` are
    re-added without a check and never counted).
    """
    if source not in ROLLUP_SOURCES:
        raise ValueError(f"no rollups over {source!r}; known: {', '.join(ROLLUP_SOURCES)}")
    runs = sorted(set(run_ids))
    short: dict[str, int] = {}
    if not runs:
        return short
    if source == "transitions":
        for sets in (_FAILURES, _DISPATCHES):
            store.command(sets, {"runs": runs}, settings={"insert_deduplicate": 0})
    for rollup in _OF_SOURCE[source]:
        n = int(store.query(_SHORT[rollup], {"runs": runs}).rows[0][0])
        if n:
            # no block-hash deduplication: a correction must never be dropped as a repeat of another
            store.command(_REPAIR[rollup], {"runs": runs}, settings={"insert_deduplicate": 0})
            short[rollup] = n
    return short
