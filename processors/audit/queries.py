"""Named audit queries and read-only SQL over the audit store.

Every value reaches ClickHouse as a server-side bound parameter (``{name:Type}``,
which clickhouse-connect passes as query parameters over HTTP and as chdb
``params`` in-process): nothing a user types is ever formatted into SQL text.
No query reads ``FINAL``: the tables are plain MergeTree filled exactly once by the sink
(insert deduplication tokens from Kafka offset ranges, infra/clickhouse/README.md), so a
row is never stored twice and reads need no deduplication. Sums come from rollup tables
that ClickHouse maintains with materialized views (``usage_hourly``, ``run_rollup``),
read with ``GROUP BY`` over their key. tests/unit/audit/test_queries.py greps this module
so ``FINAL`` does not come back.

Optional filters use ``'' = {p:String} OR col = {p:String}``: one plan for both
cases, and the primary key still prunes when the value is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentlog.audit.store import QueryResult, Store
from agentlog.schemas.errors import StoreError

__all__ = [
    "NAMED_QUERIES",
    "AuditQueries",
    "NamedQuery",
    "Param",
    "check_read_only",
    "run_named",
    "run_sql",
]

_READ_ONLY_SETTINGS = {"readonly": 1}
_TIME = "DateTime64(3, 'UTC')"


_UINT_BITS = {"UInt8": 8, "UInt32": 32, "UInt64": 64}


def _is_iso_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Param:
    """A named-query parameter: ``type`` is the ClickHouse type it is bound as.

    ``IsoTime`` is bound as a ``String`` that was checked to be an ISO 8601 time first, so a
    typo is a ``bad_param`` error instead of a silently empty window.
    """

    name: str
    type: str = "String"
    required: bool = False
    default: str | None = ""
    help: str = ""

    def coerce(self, raw: str) -> Any:
        """Validate a user-supplied string before it is bound (StoreError ``bad_param``)."""
        if not isinstance(raw, str):
            raw = str(raw)
        if self.type == "UInt8":
            if raw.strip() not in ("0", "1"):
                raise StoreError(f"parameter {self.name} must be 0 or 1, got {raw!r}", code="bad_param")
            return int(raw)
        if self.type == "IsoTime":  # bound as a String; parsed by ClickHouse once checked here
            if raw.strip() and not _is_iso_time(raw.strip()):
                raise StoreError(f"parameter {self.name} must be an ISO 8601 time such as 2026-11-22T10:00:00Z, "
                                 f"got {raw!r}", code="bad_param")
            return raw.strip()
        if self.type in _UINT_BITS:
            if not re.fullmatch(r"\d{1,19}", raw.strip()):
                raise StoreError(f"parameter {self.name} must be a non-negative integer, got {raw!r}", code="bad_param")
            value = int(raw)
            if value >= 2 ** _UINT_BITS[self.type]:
                raise StoreError(f"parameter {self.name} is out of range for {self.type}: {raw!r}", code="bad_param")
            return value
        if self.type == "Int64":
            if not re.fullmatch(r"-?\d{1,19}", raw.strip()):
                raise StoreError(f"parameter {self.name} must be an integer, got {raw!r}", code="bad_param")
            return int(raw)
        if self.type == _TIME:
            try:
                t = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
            except ValueError:
                raise StoreError(f"parameter {self.name} must be an ISO 8601 time (2026-11-22T19:00:00Z), "
                                 f"got {raw!r}", code="bad_param") from None
            t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
            return t.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        if "\x00" in raw:
            raise StoreError(f"parameter {self.name} contains a NUL byte", code="bad_param")
        return raw


@dataclass(frozen=True)
class NamedQuery:
    name: str
    help: str
    params: tuple[Param, ...]
    sql: str

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "help": self.help,
            "params": [
                {"name": p.name, "type": p.type, "required": p.required, "default": p.default, "help": p.help}
                for p in self.params
            ],
        }


_RUN_FILTER = Param("run_id", help="only this run ('' = all runs)")

_RUN_TIMELINE = """
SELECT sequence, event_time, type, node_id, event_id, causation_id, hash
FROM events
WHERE run_id = {run_id:String}
ORDER BY sequence
LIMIT {limit:UInt64}
"""

# Causation is a tree inside one run (a cause always precedes its effect). The run's rows are read
# ONCE, by the primary key prefix, into arrays ordered by sequence, and the walk is array arithmetic
# on positions: a recursive CTE re-reads the table at every level (two walks of ~log2(run) levels
# each cost ~100 ms at 10M events; this costs one read of the run).
#   parent  position of each row's cause in the run (0 = none), found by binary search over the
#           event ids sorted once (indexOfAssumeSorted), so O(n log n) for a run of n events;
#   level   each row's distance from its root, by pointer jumping (log2 n rounds): it bounds both
#           walks, so a shallow tree costs a few rounds however long max_depth is;
#   up      the chain of causes from the event, at most max_depth hops;
#   down    breadth-first depths from the event (-1 = not a descendant), one round per level.
# Rows are those of a recursive CTE (the reference in tests/unit/audit/test_query_rewrites.py): same
# relation, depth and columns, bounded by max_depth the same way (on a causation cycle, which valid
# runs never have, each event is listed once instead of once per lap).
_CAUSATION_CHAIN = """
WITH
    run AS (
        SELECT arraySort(x -> x.1, groupArray((sequence, event_id, causation_id, type, node_id))) AS r
        FROM events
        WHERE run_id = {run_id:String}
    ),
    walk AS (
        SELECT
            r,
            length(r) AS n,
            arrayMap(x -> x.2, r) AS ids,
            arraySort(i -> ids[i], range(1, n + 1)) AS by_id,
            arrayMap(i -> ids[i], by_id) AS sorted_ids,
            arrayMap(x -> if(x.3 = '', 0, by_id[indexOfAssumeSorted(sorted_ids, x.3)]), r) AS parent,
            by_id[indexOfAssumeSorted(sorted_ids, {event_id:String})] AS self,
            arrayFold((acc, k) -> (arrayMap((d, x) -> d + acc.1[x], acc.1, acc.2), arrayMap(x -> acc.2[x], acc.2)),
                      range(toUInt64(ceil(log2(n + 1))) + 1),
                      (arrayMap(p -> toUInt64(p != 0), parent), parent)).1 AS level,
            arrayFold((acc, k) -> if(parent[acc[-1]] = 0, acc, arrayPushBack(acc, parent[acc[-1]])),
                      range(least({max_depth:UInt32}, n, level[self])), [self]) AS up,
            arrayFold((acc, k) -> arrayMap((d, p) -> if(d < 0 AND p != 0 AND acc[p] = k, toInt64(k) + 1, d),
                                            acc, parent),
                      range(least(toInt64({max_depth:UInt32}), toInt64(n),
                                  toInt64(arrayMax(level)) - toInt64(level[self]))),
                      arrayMap(i -> toInt64(if(i = self, 0, -1)), range(1, n + 1))) AS down
        FROM run
    )
SELECT relation, depth, r[pos].1 AS sequence, r[pos].2 AS event_id, r[pos].3 AS causation_id, r[pos].4 AS type,
       r[pos].5 AS node_id
FROM (
    SELECT r, arrayJoin(arrayConcat(
        arrayMap((p, d) -> ('ancestor', toInt64(d), p), arraySlice(up, 2), range(1, length(up))),
        [('self', toInt64(0), self)],
        arrayFilter(t -> t.2 > 0, arrayMap((d, p) -> ('descendant', d, p), down, range(1, n + 1))))) AS t,
        t.1 AS relation, toUInt32(t.2) AS depth, t.3 AS pos
    FROM walk WHERE self != 0
)
ORDER BY sequence
"""

# From the handoff_steps rollup (migration 0005): the ms of every transition since its dispatch's
# previous one, kept by a materialized view with weights that sum to 1 per current step (see the
# migration). Usually every row weighs 1 (transitions stored in the state machine's order) and is
# read as it is; once a dispatch's phases were stored out of order its rows carry corrections
# (weights -1 and +1), and then the weights are summed per value and each value repeated as often
# as its weight says. The quantiles are exactly those of a window function over ``transitions``
# (tests/unit/audit/test_query_rewrites.py compares the two), without sorting every transition at
# read time. ``corrections`` is a constant by the time the query is planned, so only one branch reads.
_HANDOFF_LATENCY = """
WITH
    (SELECT countIf(weight != 1) FROM handoff_steps
     WHERE ({run_id:String} = '' OR parent_run_id = {run_id:String})) AS corrections,
    steps AS (
        SELECT worker_id, phase, phase_rank, ms AS v
        FROM handoff_steps
        WHERE corrections = 0 AND ({run_id:String} = '' OR parent_run_id = {run_id:String})
        UNION ALL
        SELECT worker_id, phase, phase_rank, arrayJoin(arrayWithConstant(toUInt64(times), ms)) AS v
        FROM (
            SELECT worker_id, phase, phase_rank, ms, sum(weight) AS times
            FROM handoff_steps
            WHERE corrections > 0 AND ({run_id:String} = '' OR parent_run_id = {run_id:String})
            GROUP BY worker_id, phase, phase_rank, ms
            HAVING times > 0
        )
    )
SELECT
    worker_id,
    phase,
    count() AS n,
    -- one sort for the three quantiles (the same expression is computed once)
    round(quantilesExactInclusive(0.5, 0.95, 0.99)(v)[1], 3) AS p50_ms,
    round(quantilesExactInclusive(0.5, 0.95, 0.99)(v)[2], 3) AS p95_ms,
    round(quantilesExactInclusive(0.5, 0.95, 0.99)(v)[3], 3) AS p99_ms,
    max(v) AS max_ms
FROM steps
GROUP BY worker_id, phase, phase_rank
ORDER BY worker_id, phase_rank, phase
"""

_FAILED_PHASES = "('dispatch.failed', 'child.failed', 'child.cancelled')"

# All runs: the worker_failures and worker_dispatches rollups (migration 0005: uniqExact sets per
# worker, failed phase and error code, and per worker, merged here). One run: that run's
# transitions, read by the primary key prefix. Each branch is switched off by a constant
# condition on the parameter, so only one of them reads anything.
_FAILURES = f"""
WITH
    t AS (
        SELECT worker_id, dispatch_id, phase, error_code, parent_run_id
        FROM transitions
        WHERE {{run_id:String}} != '' AND parent_run_id = {{run_id:String}}
    ),
    per_worker AS (
        SELECT worker_id, uniqExact(dispatch_id) AS dispatches FROM t GROUP BY worker_id
        UNION ALL
        SELECT worker_id, uniqExactMerge(dispatches) AS dispatches
        FROM worker_dispatches WHERE {{run_id:String}} = '' GROUP BY worker_id
    ),
    failed AS (
        SELECT worker_id, phase, if(error_code = '', '(none)', error_code) AS code,
               count() AS failures, uniqExact(parent_run_id) AS runs
        FROM t WHERE phase IN {_FAILED_PHASES}
        GROUP BY worker_id, phase, code
        UNION ALL
        SELECT worker_id, phase, if(error_code = '', '(none)', error_code) AS code,
               uniqExactMerge(transitions) AS failures, uniqExactMerge(runs) AS runs
        FROM worker_failures WHERE {{run_id:String}} = '' AND phase IN {_FAILED_PHASES}
        GROUP BY worker_id, phase, code
    )
SELECT
    f.worker_id AS worker_id,
    f.phase AS phase,
    f.code AS error_code,
    f.failures AS failures,
    f.runs AS runs,
    p.dispatches AS dispatches,
    round(failures / dispatches, 4) AS failure_rate
FROM failed AS f INNER JOIN per_worker AS p ON p.worker_id = f.worker_id
ORDER BY failures DESC, worker_id, phase, error_code
"""

# Model/provider of an LLM outcome: the request of the paired agent.invocation.started
# (latest earlier start with the same cacheKey in the run, an ASOF join), else a
# provider.usage event caused by the outcome or by that start.
_REFUSALS = """
WITH
    ev AS (
        SELECT run_id, sequence, event_id, causation_id, type, cache_key,
               request_provider, request_model, provider, model
        FROM events
        WHERE type IN ('agent.invocation.started', 'agent.invocation.completed', 'envelope.refusal', 'provider.usage')
          AND ({run_id:String} = '' OR run_id = {run_id:String})
    ),
    starts AS (
        SELECT run_id, sequence, event_id, cache_key, request_provider AS provider, request_model AS model
        FROM ev WHERE type = 'agent.invocation.started'
    ),
    usage_by_cause AS (
        SELECT run_id, causation_id, any(provider) AS provider, any(model) AS model
        FROM ev WHERE type = 'provider.usage' AND causation_id != ''
          -- only usage caused by an invocation start or outcome can pair; this keeps the join's
          -- hash tables to LLM calls instead of every provider.usage event
          AND causation_id IN (SELECT event_id FROM ev WHERE type != 'provider.usage')
        GROUP BY run_id, causation_id
    ),
    outcomes AS (
        SELECT run_id, sequence, event_id, type, cache_key
        FROM ev WHERE type IN ('agent.invocation.completed', 'envelope.refusal')
    ),
    paired AS (
        SELECT
            o.type AS type,
            multiIf(s.provider != '', s.provider, u1.provider != '', u1.provider, u2.provider != '', u2.provider,
                    '(unknown)') AS provider,
            multiIf(s.model != '', s.model, u1.model != '', u1.model, u2.model != '', u2.model, '(unknown)') AS model
        FROM outcomes AS o
        ASOF LEFT JOIN starts AS s ON o.run_id = s.run_id AND o.cache_key = s.cache_key AND o.sequence > s.sequence
        LEFT JOIN usage_by_cause AS u1 ON u1.run_id = o.run_id AND u1.causation_id = o.event_id
        LEFT JOIN usage_by_cause AS u2 ON u2.run_id = o.run_id AND u2.causation_id = s.event_id
    )
SELECT
    provider,
    model,
    countIf(type = 'agent.invocation.completed') AS completed,
    countIf(type = 'envelope.refusal') AS refused,
    completed + refused AS outcomes,
    round(refused / outcomes, 4) AS refusal_rate
FROM paired
GROUP BY provider, model
ORDER BY provider, model
"""

# From the usage_hourly rollup (materialized view over provider.usage events).
_USAGE = """
SELECT
    run_id,
    provider,
    model,
    sum(calls) AS calls,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    round(sum(cost_cents), 4) AS cost_cents
FROM usage_hourly
WHERE ({run_id:String} = '' OR run_id = {run_id:String})
GROUP BY run_id, provider, model
ORDER BY run_id, provider, model
"""

# Runs from the run_rollup table (one aggregate row per run and insert, merged by GROUP BY run_id),
# with violations and replay verdicts joined per run. Time window on the run's first event.
_RUNS = """
WITH
    r AS (
        SELECT
            run_id,
            min(started_at) AS started_at,
            max(ended_at) AS ended_at,
            transform(argMaxMerge(status), ['', 'started', 'resumed', 'resuming', 'paused', 'completed', 'failed',
                                                'cancelled'],
                      ['pending', 'running', 'running', 'running', 'paused', 'completed', 'failed', 'cancelled'],
                      'running') AS status,
            sum(events) AS events,
            max(last_sequence) AS last_sequence,
            round(sum(cost_cents), 4) AS cost_cents,
            sum(input_tokens) AS input_tokens,
            sum(output_tokens) AS output_tokens,
            sum(refusals) AS refusals,
            sum(retries) AS retries,
            sum(failures) AS failures
        FROM run_rollup
        WHERE ({model:String} = ''
               OR run_id IN (SELECT run_id FROM usage_hourly WHERE model = {model:String}))
          AND ({search:String} = '' OR positionCaseInsensitive(run_id, {search:String}) > 0)
          AND ({run_class:String} = '' OR run_id IN (
                SELECT run_id FROM events
                WHERE type = 'run.started' AND JSONExtractString(payload, 'runClass') = {run_class:String}))
        GROUP BY run_id
        HAVING started_at >= {since:DateTime64(3, 'UTC')} AND started_at < {until:DateTime64(3, 'UTC')}
           AND ({status:String} = '' OR status = {status:String})
        ORDER BY started_at DESC, run_id
        -- page here unless a filter on flags or verdicts (known only after the joins) must see every run
        LIMIT if({flagged:UInt8} = 0 AND {verdict:String} = '', {limit:UInt64} + {offset:UInt64}, 18446744073709551615)
    ),
    v AS (
        SELECT run_id, count() AS violations FROM violations
        WHERE run_id IN (SELECT run_id FROM r) GROUP BY run_id
    ),
    cl AS (
        SELECT run_id, any(JSONExtractString(payload, 'runClass')) AS run_class FROM events
        WHERE run_id IN (SELECT run_id FROM r) AND type = 'run.started' GROUP BY run_id
    ),
    rv AS (
        SELECT source_run_id, count() AS replays,
               -- the verdict of the replay run that started last: two verdicts written in one
               -- sink batch share recorded_at (replays with no stored events fall back to it)
               argMax(verdict, (s.started, recorded_at, replay_run_id)) AS last_verdict,
               countIf(verdict != 'match') AS replays_not_matching
        FROM replay_verdicts AS vv
        LEFT JOIN (
            SELECT run_id, min(started_at) AS started FROM run_rollup
            WHERE run_id IN (SELECT replay_run_id FROM replay_verdicts WHERE source_run_id IN (SELECT run_id FROM r))
            GROUP BY run_id
        ) AS s ON s.run_id = vv.replay_run_id
        WHERE source_run_id IN (SELECT run_id FROM r) GROUP BY source_run_id
    )
SELECT
    r.run_id AS run_id,
    r.status AS status,
    ifNull(cl.run_class, '') AS run_class,
    r.started_at AS started_at,
    r.ended_at AS ended_at,
    toUnixTimestamp64Milli(r.ended_at) - toUnixTimestamp64Milli(r.started_at) AS duration_ms,
    r.events AS events,
    r.last_sequence AS last_sequence,
    r.cost_cents AS cost_cents,
    r.input_tokens AS input_tokens,
    r.output_tokens AS output_tokens,
    r.refusals AS refusals,
    r.retries AS retries,
    r.failures AS failures,
    ifNull(v.violations, 0) AS violations,
    arrayFilter(f -> f != '', [
        if(r.refusals > 0, 'refused', ''), if(r.retries > 0, 'retried', ''),
        if(r.failures > 0, 'handoff_failed', ''), if(ifNull(v.violations, 0) > 0, 'violations', ''),
        if(r.events != r.last_sequence + 1, 'gap', '')]) AS flags,
    ifNull(rv.replays, 0) AS replays,
    ifNull(rv.last_verdict, '') AS last_verdict,
    ifNull(rv.replays_not_matching, 0) AS replays_not_matching
FROM r
LEFT JOIN v ON v.run_id = r.run_id
LEFT JOIN cl ON cl.run_id = r.run_id
LEFT JOIN rv ON rv.source_run_id = r.run_id
WHERE ({flagged:UInt8} = 0 OR notEmpty(flags))
  AND ({verdict:String} = '' OR last_verdict = {verdict:String})
ORDER BY started_at DESC, run_id
LIMIT {limit:UInt64} OFFSET {offset:UInt64}
"""

_REPLAY_VERDICTS = """
SELECT source_run_id, replay_run_id, mode, verdict, error_code, compared_through, first_divergence, recorded_at
FROM replay_verdicts
WHERE ({source_run_id:String} = '' OR source_run_id = {source_run_id:String})
  AND ({verdict:String} = '' OR verdict = {verdict:String})
ORDER BY source_run_id, recorded_at, replay_run_id
LIMIT {limit:UInt64}
"""

_REJECTIONS = """
SELECT
    reason,
    count() AS rejections,
    uniqExactIf(run_id, run_id != '') AS runs,
    min(source_time) AS first_seen,
    max(source_time) AS last_seen
FROM rejections
WHERE ({run_id:String} = '' OR run_id = {run_id:String})
GROUP BY reason
ORDER BY rejections DESC, reason
"""

_VIOLATIONS = """
SELECT run_id, code, count() AS violations, groupArray(10)(sequence) AS first_sequences
FROM (
    SELECT run_id, code, sequence FROM violations
    WHERE ({run_id:String} = '' OR run_id = {run_id:String})
    ORDER BY run_id, sequence
)
GROUP BY run_id, code
ORDER BY run_id, code
"""

# The console's cost/tokens chart. Buckets of bucket_s seconds (default an hour).
# Whole hours come from the usage_hourly rollup when a bucket is whole hours (a bucket of N hours
# holds whole hours: toStartOfInterval counts from the epoch); only the part of an hour after a
# ``since`` that is not on the hour, or every event for buckets that are not whole hours, is read
# from events (a scan of provider.usage). Both guards are constants, so the branch not needed
# reads nothing: the console's default (hourly, no since) reads only the rollup.
_USAGE_OVER_TIME = """
WITH
    parseDateTime64BestEffortOrZero({since:String}, 3, 'UTC') AS since_t,
    {bucket_s:UInt32} % 3600 = 0 AS whole_hours,
    -- the first hour that starts at or after since
    toDateTime64(toStartOfHour(since_t), 3, 'UTC') + toIntervalHour(toStartOfHour(since_t) != since_t) AS first_hour
SELECT
    bucket,
    provider,
    model,
    sum(n) AS calls,
    sum(input) AS input_tokens,
    sum(output) AS output_tokens,
    round(sum(cost), 4) AS cost_cents
FROM (
    SELECT toStartOfInterval(toDateTime64(hour, 3, 'UTC'), toIntervalSecond({bucket_s:UInt32})) AS bucket,
           provider, model, calls AS n, input_tokens AS input, output_tokens AS output, cost_cents AS cost
    FROM usage_hourly
    WHERE whole_hours AND hour >= first_hour
    UNION ALL
    SELECT toStartOfInterval(event_time, toIntervalSecond({bucket_s:UInt32})) AS bucket,
           provider, model, toUInt64(1) AS n, input_tokens AS input, output_tokens AS output, cost_cents AS cost
    FROM events
    WHERE (NOT whole_hours OR first_hour != since_t)
      AND type = 'provider.usage'
      AND event_time >= since_t
      AND (NOT whole_hours OR event_time < first_hour)
)
GROUP BY bucket, provider, model
ORDER BY bucket, provider, model
"""

_ISO_HELP = "ISO 8601 time ('' = unbounded)"

_LIMIT = Param("limit", "UInt64", default="10000", help="at most this many rows")

# A suite execution's replay runs carry tags in run.started (agentlog.replay.suite.execution_tags): the suite, the
# execution and the code version; the worker's verdict on each (replay_verdicts) is its outcome.
_SUITE_REPLAYS = """
    e AS (
        SELECT run_id AS replay_run_id, started_at, source_run_id,
               substring(arrayFirst(t -> startsWith(t, 'suite:'), tags), 7) AS suite,
               substring(arrayFirst(t -> startsWith(t, 'suite-execution:'), tags), 17) AS execution,
               substring(arrayFirst(t -> startsWith(t, 'code:'), tags), 6) AS code_version
        FROM (
            SELECT run_id, min(event_time) AS started_at, any(JSONExtract(payload, 'tags', 'Array(String)')) AS tags,
                   any(JSONExtractString(payload, 'replayOf', 'sourceRunId')) AS source_run_id
            FROM events
            WHERE type = 'run.started' AND position(payload, '"suite-execution:') > 0
            GROUP BY run_id
        )
        WHERE execution != ''
    ),
    v AS (
        SELECT replay_run_id, argMax(verdict, recorded_at) AS verdict,
               argMax(first_divergence, recorded_at) AS first_divergence
        FROM replay_verdicts
        WHERE replay_run_id IN (SELECT replay_run_id FROM e)
        GROUP BY replay_run_id
    )"""

_SUITE_EXECUTIONS = f"""
WITH {_SUITE_REPLAYS}
SELECT e.suite AS suite, e.execution AS execution, min(e.started_at) AS started_at,
       any(e.code_version) AS code_version, count() AS runs,
       countIf(v.verdict = 'match') AS matched,
       countIf(v.verdict IN ('diverged', 'diverged_at_refusal')) AS diverged,
       countIf(v.verdict = 'what-if') AS what_if,
       countIf(v.verdict = '') AS pending
FROM e LEFT JOIN v ON v.replay_run_id = e.replay_run_id
WHERE {{suite:String}} = '' OR e.suite = {{suite:String}}
GROUP BY e.suite, e.execution
ORDER BY started_at DESC, execution
LIMIT {{limit:UInt64}}
"""

_SUITE_RUNS = f"""
WITH {_SUITE_REPLAYS}
SELECT e.source_run_id AS source_run_id, e.replay_run_id AS replay_run_id, e.suite AS suite,
       e.code_version AS code_version, e.started_at AS started_at, v.verdict AS verdict,
       JSONExtractString(v.first_divergence, 'kind') AS kind,
       if(v.first_divergence = '' OR v.first_divergence = 'null', -1,
          JSONExtractInt(v.first_divergence, 'atSequence')) AS at_sequence
FROM e LEFT JOIN v ON v.replay_run_id = e.replay_run_id
WHERE e.execution = {{execution:String}}
ORDER BY verdict = 'match', source_run_id
LIMIT {{limit:UInt64}}
"""

NAMED_QUERIES: dict[str, NamedQuery] = {
    q.name: q
    for q in (
        NamedQuery("run-timeline", "every committed event of a run, in sequence order",
                   (Param("run_id", required=True, default=None, help="the run"), _LIMIT), _RUN_TIMELINE),
        NamedQuery("causation-chain", "ancestors and descendants of one event (by causationId)",
                   (Param("run_id", required=True, default=None, help="the run"),
                    Param("event_id", required=True, default=None, help="the event at the centre"),
                    Param("max_depth", "UInt32", default="1000", help="stop walking after this many hops")),
                   _CAUSATION_CHAIN),
        NamedQuery("handoff-latency", "p50/p95/p99 ms from a dispatch's previous transition, per worker and phase",
                   (_RUN_FILTER,), _HANDOFF_LATENCY),
        NamedQuery("failures", "dispatch/child failures by worker and error code, with the worker's failure rate",
                   (_RUN_FILTER,), _FAILURES),
        NamedQuery("refusals", "refusal rate per provider/model: envelope.refusal vs agent.invocation.completed",
                   (_RUN_FILTER,), _REFUSALS),
        NamedQuery("usage", "tokens and cost per run and model (provider.usage)", (_RUN_FILTER,), _USAGE),
        NamedQuery("runs", "runs in a time window with status, class, duration, events, cost, flags and replay "
                   "verdicts (newest first, paged)",
                   (Param("since", _TIME, default="1970-01-01T00:00:00Z",
                          help="runs whose first event is at or after this time (ISO 8601, UTC if no offset)"),
                    Param("until", _TIME, default="2299-12-31T23:59:59Z",
                          help="runs whose first event is before this time (ISO 8601, UTC if no offset)"),
                    Param("status", help="pending | running | paused | completed | failed | cancelled "
                                         "(from run.* events; '' = all)"),
                    Param("model", help="runs that used this model (provider.usage; '' = all)"),
                    Param("flagged", "UInt8", default="0", help="1 = only runs with a non-empty flags"),
                    Param("verdict", help="runs whose last replay verdict is this ('' = all)"),
                    Param("search", help="runs whose id contains this, case-insensitive ('' = all)"),
                    Param("run_class", help="runs of this class (run.started runClass; '' = all)"),
                    Param("limit", "UInt64", default="100", help="page size"),
                    Param("offset", "UInt64", default="0", help="rows to skip (page * limit)")),
                   _RUNS),
        NamedQuery("replay-verdicts", "replay verdicts, newest last",
                   (Param("source_run_id", help="only replays of this run ('' = all)"),
                    Param("verdict", help="match | diverged | diverged_at_refusal | what-if ('' = all)"), _LIMIT),
                   _REPLAY_VERDICTS),
        NamedQuery("suite-executions", "replay-suite executions, newest first: runs and verdict counts per "
                   "execution (a suite's verdicts over time)",
                   (Param("suite", help="only this suite ('' = all)"), _LIMIT), _SUITE_EXECUTIONS),
        NamedQuery("suite-runs", "the runs of one replay-suite execution with their verdicts, diverged first",
                   (Param("execution", required=True, default=None, help="the execution id (replay-suite --json)"),
                    _LIMIT), _SUITE_RUNS),
        NamedQuery("rejections", "rejected ingest records by reason", (_RUN_FILTER,), _REJECTIONS),
        NamedQuery("violations", "handoff violations by run and code", (_RUN_FILTER,), _VIOLATIONS),
        # the console's cost/tokens chart
        NamedQuery("usage-over-time", "calls, tokens and cost per model per time bucket (provider.usage)",
                   (Param("bucket_s", "UInt32", default="3600", help="bucket width in seconds"),
                    Param("since", "IsoTime", help="usage at or after this " + _ISO_HELP)),
                   _USAGE_OVER_TIME),
    )
}


def _bind(query: NamedQuery, params: Mapping[str, Any]) -> dict[str, Any]:
    known = {p.name for p in query.params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise StoreError(
            f"query {query.name} has no parameter {', '.join(unknown)}; it takes: {', '.join(sorted(known)) or 'none'}",
            code="bad_param",
        )
    bound: dict[str, Any] = {}
    for p in query.params:
        raw = params.get(p.name)
        if raw is None or (raw == "" and (p.required or p.type == _TIME)):
            if p.required:
                raise StoreError(f"query {query.name} needs --param {p.name}=<{p.type}>", code="bad_param")
            raw = p.default if p.default is not None else ""
        bound[p.name] = p.coerce(raw)
    return bound


def run_named(store: Store, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
    """Run a named query with its parameters bound (values arrive as strings from CLI/HTTP).

    Raises:
        StoreError: ``unknown_query``, ``bad_param``; ClickHouseError (a StoreError)
            from the server, with its numeric code and name.
    """
    query = NAMED_QUERIES.get(name)
    if query is None:
        raise StoreError(f"no named query {name!r}; known: {', '.join(NAMED_QUERIES)}", code="unknown_query")
    return store.query(query.sql, _bind(query, params or {}), settings=_READ_ONLY_SETTINGS)


# -- read-only SQL --------------------------------------------------------------------------------
_READ_KEYWORDS = {"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"}


def _strip_sql(sql: str) -> tuple[str, bool]:
    """SQL with comments and literals blanked out, and whether it holds more than one statement."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n and sql[j] != c:
                j += 2 if sql[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        elif sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            i = n if j == -1 else j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j == -1 else j + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    text = "".join(out).strip()
    body = text.rstrip().rstrip(";").rstrip()
    return body, ";" in body


def check_read_only(sql: str) -> None:
    """Refuse anything but one SELECT/WITH/SHOW/DESCRIBE/EXPLAIN/EXISTS statement.

    The server also runs it with ``readonly=1`` (chdb honours it: verified); this
    check gives a clear ``read_only`` error first and covers statements readonly
    allows (``KILL QUERY``).
    """
    body, multiple = _strip_sql(sql)
    if not body:
        raise StoreError("empty SQL", code="read_only")
    if multiple:
        raise StoreError("only one statement per request; remove the ';' between statements", code="read_only")
    first = re.match(r"\(*\s*([A-Za-z]+)", body)
    keyword = first.group(1).upper() if first else ""
    if keyword not in _READ_KEYWORDS:
        raise StoreError(
            f"{keyword or 'this statement'} is not allowed: sql is read-only "
            f"(SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS)",
            code="read_only",
        )


def run_sql(store: Store, sql: str) -> QueryResult:
    """Run one read-only statement (``readonly=1`` on the server side as well).

    Raises:
        StoreError: ``read_only`` for writes, DDL, several statements or anything the
            server refuses in readonly mode (code 164 READONLY).
    """
    check_read_only(sql)
    try:
        return store.query(sql, settings=_READ_ONLY_SETTINGS)
    except StoreError as e:
        if getattr(e, "server_name", None) == "READONLY":
            raise StoreError(f"sql is read-only; the server refused: {e}", code="read_only") from e
        raise


# -- Python API ------------------------------------------------------------------------------------
class AuditQueries:
    """The named queries as methods: ``AuditQueries(store).run_timeline("run-1").rows``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def run(self, name: str, **params: Any) -> QueryResult:
        return run_named(self.store, name, {k: v for k, v in params.items() if v is not None})

    def run_timeline(self, run_id: str, *, limit: int | None = None) -> QueryResult:
        return self.run("run-timeline", run_id=run_id, limit=limit)

    def causation_chain(self, run_id: str, event_id: str, *, max_depth: int | None = None) -> QueryResult:
        return self.run("causation-chain", run_id=run_id, event_id=event_id, max_depth=max_depth)

    def handoff_latency(self, run_id: str | None = None) -> QueryResult:
        return self.run("handoff-latency", run_id=run_id)

    def failures(self, run_id: str | None = None) -> QueryResult:
        return self.run("failures", run_id=run_id)

    def refusals(self, run_id: str | None = None) -> QueryResult:
        return self.run("refusals", run_id=run_id)

    def usage(self, run_id: str | None = None) -> QueryResult:
        return self.run("usage", run_id=run_id)

    def runs(self, *, since: str | None = None, until: str | None = None, status: str | None = None,
             model: str | None = None, flagged: bool | int | None = None, verdict: str | None = None,
             search: str | None = None, run_class: str | None = None, limit: int | None = None,
             offset: int | None = None) -> QueryResult:
        return self.run("runs", since=since, until=until, status=status, model=model,
                        flagged=None if flagged is None else int(flagged), verdict=verdict, search=search,
                        run_class=run_class, limit=limit, offset=offset)

    def replay_verdicts(self, source_run_id: str | None = None, *, verdict: str | None = None,
                        limit: int | None = None) -> QueryResult:
        return self.run("replay-verdicts", source_run_id=source_run_id, verdict=verdict, limit=limit)

    def rejections(self, run_id: str | None = None) -> QueryResult:
        return self.run("rejections", run_id=run_id)

    def violations(self, run_id: str | None = None) -> QueryResult:
        return self.run("violations", run_id=run_id)

    def sql(self, sql: str) -> QueryResult:
        return run_sql(self.store, sql)
