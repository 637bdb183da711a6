-- Cluster variant of migrations/0005_handoff_rollups.sql (same columns, keys and views; read that file
-- for the design). Replicated tables sharded like transitions (cityHash64(parent_run_id)), so every
-- transition of a dispatch is on the shard whose view computes its steps; the view reads the shard's
-- own transitions_local through merge().

CREATE TABLE IF NOT EXISTS handoff_steps_local ON CLUSTER '{cluster}'
(
    parent_run_id String,
    dispatch_id   String,
    phase         LowCardinality(String),
    phase_rank    UInt8,
    worker_id     LowCardinality(String),
    ms            Int64,
    weight        Int64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/handoff_steps_local', '{replica}')
ORDER BY (parent_run_id, dispatch_id, phase);

CREATE TABLE IF NOT EXISTS handoff_steps ON CLUSTER '{cluster}' AS handoff_steps_local
ENGINE = Distributed('{cluster}', currentDatabase(), handoff_steps_local, cityHash64(parent_run_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS handoff_steps_mv ON CLUSTER '{cluster}' TO handoff_steps_local AS
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
               (k.parent_run_id, k.dispatch_id, m.phase) IN (SELECT parent_run_id, dispatch_id, phase FROM transitions_local)
                   AS new
        FROM (SELECT DISTINCT parent_run_id, dispatch_id FROM transitions_local) AS k
        INNER JOIN (
            -- bounded by the primary key to the runs of the insert
            SELECT parent_run_id, dispatch_id, phase, worker_id, event_time
            FROM merge(currentDatabase(), '^transitions_local$')
            WHERE (parent_run_id, dispatch_id) IN (SELECT parent_run_id, dispatch_id FROM transitions_local)
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
CREATE TABLE IF NOT EXISTS worker_failures_local ON CLUSTER '{cluster}'
(
    worker_id   String,
    phase       LowCardinality(String),
    error_code  LowCardinality(String),
    transitions AggregateFunction(uniqExact, String, String),
    runs        AggregateFunction(uniqExact, String)
)
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/worker_failures_local', '{replica}')
ORDER BY (worker_id, phase, error_code);

CREATE TABLE IF NOT EXISTS worker_failures ON CLUSTER '{cluster}' AS worker_failures_local
ENGINE = Distributed('{cluster}', currentDatabase(), worker_failures_local, cityHash64(worker_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS worker_failures_mv ON CLUSTER '{cluster}' TO worker_failures_local AS
SELECT worker_id, phase, error_code, uniqExactState(parent_run_id, dispatch_id) AS transitions,
       uniqExactState(parent_run_id) AS runs
FROM transitions_local
WHERE phase IN ('dispatch.failed', 'child.failed', 'child.cancelled')
GROUP BY worker_id, phase, error_code;

CREATE TABLE IF NOT EXISTS worker_dispatches_local ON CLUSTER '{cluster}'
(
    worker_id  String,
    dispatches AggregateFunction(uniqExact, String)
)
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/worker_dispatches_local', '{replica}')
ORDER BY worker_id;

CREATE TABLE IF NOT EXISTS worker_dispatches ON CLUSTER '{cluster}' AS worker_dispatches_local
ENGINE = Distributed('{cluster}', currentDatabase(), worker_dispatches_local, cityHash64(worker_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS worker_dispatches_mv ON CLUSTER '{cluster}' TO worker_dispatches_local AS
SELECT worker_id, uniqExactState(dispatch_id) AS dispatches
FROM transitions_local
GROUP BY worker_id;
