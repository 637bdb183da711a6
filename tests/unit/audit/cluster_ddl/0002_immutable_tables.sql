-- Cluster variant of ../migrations/0002_immutable_tables.sql (macros {cluster}, {shard}, {replica}).
-- <table>_local: Replicated*MergeTree per shard (replicated inserts deduplicate by block hash or
-- insert_deduplication_token within replicated_deduplication_window, default 1000 — the same
-- exactly-once mechanism as the single node's non_replicated_deduplication_window);
-- <table>: Distributed over <table>_local sharded by run (cityHash64 of the run column), so one
-- run's rows, rollup rows included, live on one shard and a rollup GROUP BY stays exact.
-- Rollup views run on every shard, from <source>_local to <rollup>_local.
-- NOT RUN here (no ClickHouse server on our machines). Upgrading a cluster built by 0001 is a
-- manual step: see ../README.md, "Upgrading a cluster"; the runner refuses (manual_upgrade).


CREATE TABLE IF NOT EXISTS events_local ON CLUSTER '{cluster}'
(
    run_id          String,
    sequence        UInt64,
    event_id        String,
    causation_id    String,
    type            LowCardinality(String),
    node_id         String,
    event_time      DateTime64(3, 'UTC'),
    ingested_at     DateTime64(3, 'UTC'),
    source_topic    LowCardinality(String),
    kafka_partition Int32,
    kafka_offset    Int64,
    hash            String,
    prev_hash       String,
    payload         String,
    doc             String,
    state_hash      String DEFAULT '',            -- CommittedEvent.stateHash (format 2), '' for format 1
    provider        LowCardinality(String) MATERIALIZED if(type = 'provider.usage', JSONExtractString(payload, 'provider'), ''),
    model           LowCardinality(String) MATERIALIZED if(type = 'provider.usage', JSONExtractString(payload, 'model'), ''),
    input_tokens    UInt64 MATERIALIZED if(type = 'provider.usage', JSONExtractUInt(payload, 'inputTokens'), 0),
    output_tokens   UInt64 MATERIALIZED if(type = 'provider.usage', JSONExtractUInt(payload, 'outputTokens'), 0),
    cost_cents      Float64 MATERIALIZED if(type = 'provider.usage', JSONExtractFloat(payload, 'costCents'), 0),
    refusal         Bool MATERIALIZED type = 'envelope.refusal',
    cache_key       String MATERIALIZED if(type IN ('agent.invocation.started', 'agent.invocation.completed', 'envelope.refusal'), JSONExtractString(payload, 'cacheKey'), ''),
    request_provider LowCardinality(String) MATERIALIZED if(type = 'agent.invocation.started', JSONExtractString(payload, 'request', 'provider'), ''),
    request_model   LowCardinality(String) MATERIALIZED if(type = 'agent.invocation.started', JSONExtractString(payload, 'request', 'model'), ''),
    tool_name       LowCardinality(String) MATERIALIZED if(type = 'agent.toolCalled', JSONExtractString(payload, 'tool'), ''),
    handoff_phase   LowCardinality(String) MATERIALIZED if(type = 'core.workflowChain.event', JSONExtractString(payload, 'phase'), ''),
    worker_id       LowCardinality(String) MATERIALIZED if(type = 'core.workflowChain.event', JSONExtractString(payload, 'workerId'), ''),
    error_code      LowCardinality(String) MATERIALIZED JSONExtractString(payload, 'errorCode'),
    replay_verdict  LowCardinality(String) MATERIALIZED if(startsWith(type, 'replay.'), JSONExtractString(payload, 'verdict'), ''),
    INDEX idx_event_id event_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_type type TYPE set(512) GRANULARITY 4
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/events_local', '{replica}')
ORDER BY (run_id, sequence);

CREATE TABLE IF NOT EXISTS events ON CLUSTER '{cluster}' AS events_local
ENGINE = Distributed('{cluster}', currentDatabase(), events_local, cityHash64(run_id));

CREATE TABLE IF NOT EXISTS transitions_local ON CLUSTER '{cluster}'
(
    parent_run_id  String,
    dispatch_id    String,
    phase          LowCardinality(String),
    worker_id      String,
    child_run_id   String,
    from_state     LowCardinality(String),
    to_state       LowCardinality(String),
    event_id       String,
    causation_id   String,
    sequence       Nullable(UInt64),
    derived        Bool,
    event_time     DateTime64(3, 'UTC'),
    harvested_keys Array(String),
    error_code     LowCardinality(String),
    error          String,
    doc            String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/transitions_local', '{replica}')
ORDER BY (parent_run_id, dispatch_id, phase);

CREATE TABLE IF NOT EXISTS transitions ON CLUSTER '{cluster}' AS transitions_local
ENGINE = Distributed('{cluster}', currentDatabase(), transitions_local, cityHash64(parent_run_id));

CREATE TABLE IF NOT EXISTS violations_local ON CLUSTER '{cluster}'
(
    run_id      String,
    sequence    UInt64,
    event_id    String,
    code        LowCardinality(String),
    detail      String,
    worker_id   String,
    phase       LowCardinality(String),
    dispatch_id String,
    doc         String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/violations_local', '{replica}')
ORDER BY (run_id, sequence, event_id, code);

CREATE TABLE IF NOT EXISTS violations ON CLUSTER '{cluster}' AS violations_local
ENGINE = Distributed('{cluster}', currentDatabase(), violations_local, cityHash64(run_id));

CREATE TABLE IF NOT EXISTS rejections_local ON CLUSTER '{cluster}'
(
    source_topic     LowCardinality(String),
    source_partition Int32,
    source_offset    Int64,
    reason           LowCardinality(String),
    detail           String,
    run_id           String,
    event_id         String,
    sequence         Nullable(Int64),
    source_time      DateTime64(3, 'UTC'),
    raw              String,
    doc              String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/rejections_local', '{replica}')
ORDER BY (source_topic, source_partition, source_offset);

CREATE TABLE IF NOT EXISTS rejections ON CLUSTER '{cluster}' AS rejections_local
ENGINE = Distributed('{cluster}', currentDatabase(), rejections_local, cityHash64(source_topic));

CREATE TABLE IF NOT EXISTS snapshots_local ON CLUSTER '{cluster}'
(
    run_id        String,
    at_sequence   UInt64,
    log_partition Int32,
    log_offset    Int64,
    state         String,
    state_hash    String,
    head_hash     String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/snapshots_local', '{replica}')
ORDER BY (run_id, at_sequence);

CREATE TABLE IF NOT EXISTS snapshots ON CLUSTER '{cluster}' AS snapshots_local
ENGINE = Distributed('{cluster}', currentDatabase(), snapshots_local, cityHash64(run_id));

CREATE TABLE IF NOT EXISTS state_digests_local ON CLUSTER '{cluster}'
(
    run_id        String,
    sequence      UInt64,
    state_hash    String,
    head_hash     String,
    log_partition Int32,
    log_offset    Int64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/state_digests_local', '{replica}')
ORDER BY (run_id, sequence);

CREATE TABLE IF NOT EXISTS state_digests ON CLUSTER '{cluster}' AS state_digests_local
ENGINE = Distributed('{cluster}', currentDatabase(), state_digests_local, cityHash64(run_id));

CREATE TABLE IF NOT EXISTS replay_verdicts_local ON CLUSTER '{cluster}'
(
    source_run_id    String,
    replay_run_id    String,
    record_hash      String,
    mode             LowCardinality(String),
    verdict          LowCardinality(String),
    error_code       LowCardinality(String),
    compared_through Int64,
    first_divergence String,
    events           String,
    doc              String,
    recorded_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/replay_verdicts_local', '{replica}')
ORDER BY (source_run_id, replay_run_id, record_hash);

CREATE TABLE IF NOT EXISTS replay_verdicts ON CLUSTER '{cluster}' AS replay_verdicts_local
ENGINE = Distributed('{cluster}', currentDatabase(), replay_verdicts_local, cityHash64(source_run_id));

CREATE TABLE IF NOT EXISTS sink_offsets_local ON CLUSTER '{cluster}'
(
    topic      LowCardinality(String),
    partition  Int32,
    lo         Int64,
    hi         Int64,
    written_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/sink_offsets_local', '{replica}', hi)
ORDER BY (topic, partition);

CREATE TABLE IF NOT EXISTS sink_offsets ON CLUSTER '{cluster}' AS sink_offsets_local
ENGINE = Distributed('{cluster}', currentDatabase(), sink_offsets_local, cityHash64(topic));

CREATE TABLE IF NOT EXISTS usage_hourly_local ON CLUSTER '{cluster}'
(
    run_id        String,
    provider      LowCardinality(String),
    model         LowCardinality(String),
    hour          DateTime('UTC'),
    calls         SimpleAggregateFunction(sum, UInt64),
    input_tokens  SimpleAggregateFunction(sum, UInt64),
    output_tokens SimpleAggregateFunction(sum, UInt64),
    cost_cents    SimpleAggregateFunction(sum, Float64)
)
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/usage_hourly_local', '{replica}')
ORDER BY (run_id, provider, model, hour);

CREATE TABLE IF NOT EXISTS usage_hourly ON CLUSTER '{cluster}' AS usage_hourly_local
ENGINE = Distributed('{cluster}', currentDatabase(), usage_hourly_local, cityHash64(run_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_hourly_mv ON CLUSTER '{cluster}' TO usage_hourly_local AS
SELECT run_id, provider, model, toStartOfHour(event_time) AS hour,
       toUInt64(count()) AS calls, sum(input_tokens) AS input_tokens,
       sum(output_tokens) AS output_tokens, sum(cost_cents) AS cost_cents
FROM events_local
WHERE type = 'provider.usage'
GROUP BY run_id, provider, model, hour;

CREATE TABLE IF NOT EXISTS run_rollup_local ON CLUSTER '{cluster}'
(
    run_id        String,
    started_at    SimpleAggregateFunction(min, DateTime64(3, 'UTC')),
    ended_at      SimpleAggregateFunction(max, DateTime64(3, 'UTC')),
    events        SimpleAggregateFunction(sum, UInt64),
    last_sequence SimpleAggregateFunction(max, UInt64),
    status        AggregateFunction(argMax, String, UInt64),
    cost_cents    SimpleAggregateFunction(sum, Float64),
    input_tokens  SimpleAggregateFunction(sum, UInt64),
    output_tokens SimpleAggregateFunction(sum, UInt64),
    refusals      SimpleAggregateFunction(sum, UInt64),
    retries       SimpleAggregateFunction(sum, UInt64),
    failures      SimpleAggregateFunction(sum, UInt64)
)
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/run_rollup_local', '{replica}')
ORDER BY run_id;

CREATE TABLE IF NOT EXISTS run_rollup ON CLUSTER '{cluster}' AS run_rollup_local
ENGINE = Distributed('{cluster}', currentDatabase(), run_rollup_local, cityHash64(run_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS run_rollup_mv ON CLUSTER '{cluster}' TO run_rollup_local AS
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
FROM events_local
GROUP BY run_id;
