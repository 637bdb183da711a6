-- Audit history, single node (chdb or one ClickHouse server).
-- Every table is a ReplacingMergeTree whose ORDER BY is the record's natural key, so a
-- redelivered sink batch collapses to one row; every named query reads with FINAL.
-- Rationale for each key: infra/clickhouse/README.md.

-- The committed, hash-chained log: one row per (run_id, sequence).
CREATE TABLE IF NOT EXISTS events
(
    run_id          String,
    sequence        UInt64,
    event_id        String,
    causation_id    String,                       -- '' when the doc has none
    type            LowCardinality(String),
    node_id         String,                       -- '' when the doc has none
    event_time      DateTime64(3, 'UTC'),         -- doc.timestamp
    ingested_at     DateTime64(3, 'UTC'),         -- Kafka timestamp of the ingest record
    source_topic    LowCardinality(String),
    kafka_partition Int32,                        -- ingest partition
    kafka_offset    Int64,                        -- ingest offset
    hash            String,
    prev_hash       String,
    payload         String,                       -- JCS JSON of doc.payload
    doc             String,                       -- JCS JSON of the whole RunEventDoc
    INDEX idx_event_id event_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_type type TYPE set(512) GRANULARITY 4
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (run_id, sequence);

-- Handoff state-machine transitions: one row per (parent run, dispatch, phase).
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
    sequence       Nullable(UInt64),              -- NULL for derived transitions
    derived        Bool,
    event_time     DateTime64(3, 'UTC'),
    harvested_keys Array(String),
    error_code     LowCardinality(String),        -- '' unless failed
    error          String,                        -- JCS JSON of Transition.error, '' when null
    doc            String
)
ENGINE = ReplacingMergeTree
ORDER BY (parent_run_id, dispatch_id, phase);

-- Handoff violations: one row per (run, offending event, code).
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
ENGINE = ReplacingMergeTree
ORDER BY (run_id, sequence, event_id, code);

-- Rejected ingest records: one row per source record (topic, partition, offset).
CREATE TABLE IF NOT EXISTS rejections
(
    source_topic     LowCardinality(String),
    source_partition Int32,
    source_offset    Int64,
    reason           LowCardinality(String),
    detail           String,
    run_id           String,                      -- '' when unknown
    event_id         String,
    sequence         Nullable(Int64),
    source_time      DateTime64(3, 'UTC'),
    raw              String,                      -- base64 of the original bytes
    doc              String
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset);

-- Run snapshots: one row per (run, at_sequence).
CREATE TABLE IF NOT EXISTS snapshots
(
    run_id        String,
    at_sequence   UInt64,
    log_partition Int32,
    log_offset    Int64,
    state         String,                         -- JCS JSON
    state_hash    String,
    head_hash     String
)
ENGINE = ReplacingMergeTree
ORDER BY (run_id, at_sequence);

-- Per-index state digests: one row per (run, sequence).
CREATE TABLE IF NOT EXISTS state_digests
(
    run_id        String,
    sequence      UInt64,
    state_hash    String,
    head_hash     String,
    log_partition Int32,
    log_offset    Int64
)
ENGINE = ReplacingMergeTree
ORDER BY (run_id, sequence);

-- Replay verdicts: a verdict has no id of its own, so its content hash is the key:
-- a redelivered verdict collapses, a second replay of the same run is kept.
CREATE TABLE IF NOT EXISTS replay_verdicts
(
    source_run_id    String,
    replay_run_id    String,
    record_hash      String,                      -- sha256(JCS(verdict))
    mode             LowCardinality(String),
    verdict          LowCardinality(String),
    error_code       LowCardinality(String),
    compared_through Int64,
    first_divergence String,                      -- JCS JSON, '' when null
    events           String,                      -- JCS JSON array of replay.* docs
    doc              String,
    recorded_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY (source_run_id, replay_run_id, record_hash);
