-- Rollups of the handoff transitions (issue 14): the all-runs handoff-latency and failures queries read
-- these instead of every transition. Both are filled by materialized views on transitions and
-- backfilled from the rows already stored when a store is upgraded (processors/audit/migrations.py).
--
-- handoff_steps: one row per transition that is not the first of its dispatch, with the ms since the
-- dispatch's previous transition (phase rank, then time: the order of the handoff-latency query).
-- A transition's step depends on the other transitions of its dispatch, which may have been inserted
-- earlier (a child's completion comes long after its dispatch began) or, from another partition,
-- out of order. So the view recomputes the steps of every dispatch the insert touches from the whole
-- table (read through merge(), which a view does not replace by the inserted block) twice, with and
-- without the inserted rows, and writes the difference as weights: +1 for a step that appears, -1 for
-- one that the new rows changed. In order (the usual case) that is exactly one +1 row per new step.
-- The sum of weights per (dispatch, phase, ms) is 1 for every current step and 0 for every other;
-- the query reads the values with their weights, so the quantiles are those of the transitions table.
CREATE TABLE IF NOT EXISTS handoff_steps
(
    parent_run_id String,
    dispatch_id   String,
    phase         LowCardinality(String),
    phase_rank    UInt8,
    worker_id     LowCardinality(String),
    ms            Int64,
    weight        Int64
)
ENGINE = MergeTree
ORDER BY (parent_run_id, dispatch_id, phase)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS handoff_steps_mv TO handoff_steps AS
WITH
    dispatch AS (
        -- the view's source must be the first table: the inserted block's dispatches, then all their rows
        SELECT k.parent_run_id AS parent_run_id, k.dispatch_id AS dispatch_id, m.phase AS phase,
               m.worker_id AS worker_id,
               multiIf(m.phase = 'dispatch.began', 0,
                       m.phase IN ('dispatch.succeeded', 'dispatch.failed'), 1,
                       m.phase IN ('child.completed', 'child.failed', 'child.cancelled'), 2,
                       m.phase = 'output.harvested', 3,
                       9) AS phase_rank,
               toUnixTimestamp64Milli(m.event_time) AS t,
               (k.parent_run_id, k.dispatch_id, m.phase) IN (SELECT parent_run_id, dispatch_id, phase FROM transitions)
                   AS new
        FROM (SELECT DISTINCT parent_run_id, dispatch_id FROM transitions) AS k
        INNER JOIN (
            -- bounded by the primary key to the runs of the insert
            SELECT parent_run_id, dispatch_id, phase, worker_id, event_time
            FROM merge(currentDatabase(), '^transitions$')
            WHERE (parent_run_id, dispatch_id) IN (SELECT parent_run_id, dispatch_id FROM transitions)
        ) AS m ON m.parent_run_id = k.parent_run_id AND m.dispatch_id = k.dispatch_id
    ),
    after AS (
        SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id,
               t - lagInFrame(t) OVER w AS ms, row_number() OVER w AS step
        FROM dispatch
        WINDOW w AS (PARTITION BY parent_run_id, dispatch_id ORDER BY phase_rank, t
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    ),
    before AS (
        SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id,
               t - lagInFrame(t) OVER w AS ms, row_number() OVER w AS step
        FROM dispatch
        WHERE NOT new
        WINDOW w AS (PARTITION BY parent_run_id, dispatch_id ORDER BY phase_rank, t
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
    )
SELECT parent_run_id, dispatch_id, phase, toUInt8(phase_rank) AS phase_rank, worker_id, ms, sum(w) AS weight
FROM (
    SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, toInt64(1) AS w FROM after WHERE step > 1
    UNION ALL
    SELECT parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms, toInt64(-1) AS w FROM before WHERE step > 1
)
GROUP BY parent_run_id, dispatch_id, phase, phase_rank, worker_id, ms
HAVING weight != 0;

-- worker_failures: per (worker, failed phase, error code) the set of its failed transitions and of
-- their runs; worker_dispatches: per worker the set of its dispatches (the failure rate's
-- denominator). uniqExact states: sets, not counts, so aggregating the same transitions again
-- changes nothing and the rollup repair (processors/audit/rollups.py) can simply re-add the runs of
-- a re-formed range. One row per (parent run, dispatch, phase) in transitions makes the size of the
-- transition set the count. Dispatches are a table of their own, keyed by worker alone, so each
-- dispatch is in one set however many phases it went through.
CREATE TABLE IF NOT EXISTS worker_failures
(
    worker_id   String,
    phase       LowCardinality(String),
    error_code  LowCardinality(String),
    transitions AggregateFunction(uniqExact, String, String),
    runs        AggregateFunction(uniqExact, String)
)
ENGINE = AggregatingMergeTree
ORDER BY (worker_id, phase, error_code)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS worker_failures_mv TO worker_failures AS
SELECT worker_id, phase, error_code, uniqExactState(parent_run_id, dispatch_id) AS transitions,
       uniqExactState(parent_run_id) AS runs
FROM transitions
WHERE phase IN ('dispatch.failed', 'child.failed', 'child.cancelled')
GROUP BY worker_id, phase, error_code;

CREATE TABLE IF NOT EXISTS worker_dispatches
(
    worker_id  String,
    dispatches AggregateFunction(uniqExact, String)
)
ENGINE = AggregatingMergeTree
ORDER BY worker_id
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS worker_dispatches_mv TO worker_dispatches AS
SELECT worker_id, uniqExactState(dispatch_id) AS dispatches
FROM transitions
GROUP BY worker_id;
