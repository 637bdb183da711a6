"""Repair of the rollups (``usage_hourly``, ``run_rollup``) after a SIGKILL in the middle of a sink insert.

ClickHouse commits an insert's part in ``events`` first and only then runs the materialized views
into the rollups: a SIGKILL in between leaves the events stored and the rollups without them
(seen in 36 of 95 SIGKILLs of a chdb process inserting sink batches, issue 14). The sink's
re-formed batch finds every event present and would insert nothing, so the rollups would stay
short for good.

So when the sink re-forms a range of the log, it calls :func:`repair` for the runs of that range:
per run (and per usage key), what the view would have produced from ``events`` minus what the
rollup holds, inserted where the rollup holds less. The sums become exact; min, max and argMax
columns take the full aggregate again, which merges to the same value. Nothing happens where the
rollup already agrees, so repairing twice (a crash during the repair) is harmless. A rollup
holding MORE than ``events`` (rows expired by ``events_ttl_days``) is left alone.

The SELECTs mirror the views of migration 0002; ``tests/unit/audit/test_rollups.py`` checks that a
repaired rollup equals the one the views build.
"""

from __future__ import annotations

from processors.audit.store import Store

__all__ = ["repair"]

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

_REPAIR = {"usage_hourly": _USAGE, "run_rollup": _RUN}


def repair(store: Store, run_ids: list[str]) -> dict[str, int]:
    """Bring the rollups of ``run_ids`` up to ``events``; returns, per rollup, how many runs were short."""
    runs = sorted(set(run_ids))
    short: dict[str, int] = {}
    if not runs:
        return short
    for rollup, check in _SHORT.items():
        n = int(store.query(check, {"runs": runs}).rows[0][0])
        if n:
            # no block-hash deduplication: a correction must never be dropped as a repeat of another
            store.command(_REPAIR[rollup], {"runs": runs}, settings={"insert_deduplicate": 0})
            short[rollup] = n
    return short
