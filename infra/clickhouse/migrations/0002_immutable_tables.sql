-- Exactly-once audit store (issue 14): every audit table becomes a plain MergeTree. The sink inserts
-- each Kafka batch (topic, partition, offset range) with insert_deduplication_token set from that
-- range, so a redelivered batch is dropped by ClickHouse at insert time and no read needs FINAL.
-- non_replicated_deduplication_window keeps the tokens of the last N inserts per table.
-- No PARTITION BY: a sink batch must land as ONE part (all or nothing), so that the sink's
-- "skip keys already stored" step (it drops records the log holds twice after a producer retry)
-- cannot turn a half-landed batch into a different batch with the same token. Retention is a
-- row TTL (Settings.events_ttl_days), which needs no partitions.
--
-- Upgrade: on a store built by 0001 these tables exist as ReplacingMergeTree. The migration runner
-- (processors/audit/migrations.py, _rebuild) sees that the existing engine differs from the one
-- declared here, builds the declared table beside it, copies one row per old sort key, swaps the two
-- with EXCHANGE TABLES and keeps the old one as <table>_0001 (drop it once satisfied).

CREATE TABLE IF NOT EXISTS events
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
    -- Extracted by ClickHouse at insert time (never at query time) for what analysts filter and sum.
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
ENGINE = MergeTree
ORDER BY (run_id, sequence)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS transitions
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
ENGINE = MergeTree
ORDER BY (parent_run_id, dispatch_id, phase)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS violations
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
ENGINE = MergeTree
ORDER BY (run_id, sequence, event_id, code)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS rejections
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
ENGINE = MergeTree
ORDER BY (source_topic, source_partition, source_offset)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS snapshots
(
    run_id        String,
    at_sequence   UInt64,
    log_partition Int32,
    log_offset    Int64,
    state         String,
    state_hash    String,
    head_hash     String
)
ENGINE = MergeTree
ORDER BY (run_id, at_sequence)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS state_digests
(
    run_id        String,
    sequence      UInt64,
    state_hash    String,
    head_hash     String,
    log_partition Int32,
    log_offset    Int64
)
ENGINE = MergeTree
ORDER BY (run_id, sequence)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS replay_verdicts
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
ENGINE = MergeTree
ORDER BY (source_run_id, replay_run_id, record_hash)
SETTINGS non_replicated_deduplication_window = 10000;

-- The sink's exactly-once state: the offset range of the batch it is about to insert, per
-- (topic, partition), written BEFORE the insert. After a crash the sink re-forms exactly that range
-- and inserts it with the same token (a no-op if it had landed), then goes on from hi + 1.
-- Read with argMax(.., hi): the newest range wins, no FINAL needed.
CREATE TABLE IF NOT EXISTS sink_offsets
(
    topic      LowCardinality(String),
    partition  Int32,
    lo         Int64,
    hi         Int64,
    written_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(hi)
ORDER BY (topic, partition);

-- Rollups maintained by ClickHouse. Exact because every insert into the source tables is
-- exactly-once, and a deduplicated source insert is also skipped by the views (the targets keep a
-- deduplication window too, verified on chdb 26.9). Readers GROUP BY the key (never FINAL).
CREATE TABLE IF NOT EXISTS usage_hourly
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
ENGINE = AggregatingMergeTree
ORDER BY (run_id, provider, model, hour)
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_hourly_mv TO usage_hourly AS
SELECT run_id, provider, model, toStartOfHour(event_time) AS hour,
       toUInt64(count()) AS calls, sum(input_tokens) AS input_tokens,
       sum(output_tokens) AS output_tokens, sum(cost_cents) AS cost_cents
FROM events
WHERE type = 'provider.usage'
GROUP BY run_id, provider, model, hour;

CREATE TABLE IF NOT EXISTS run_rollup
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
ENGINE = AggregatingMergeTree
ORDER BY run_id
SETTINGS non_replicated_deduplication_window = 10000;

CREATE MATERIALIZED VIEW IF NOT EXISTS run_rollup_mv TO run_rollup AS
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
GROUP BY run_id
