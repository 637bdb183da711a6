-- Audit history on a ClickHouse cluster (macros {cluster}, {shard}, {replica} defined on every node).
-- <table>_local: ReplicatedReplacingMergeTree, one replica set per shard, same ORDER BY as single node.
-- <table>: Distributed over <table>_local, sharded by the record's run, so every version of a row lands on
-- the same shard and FINAL (which deduplicates per shard) stays exact. Queries and the sink use <table>.
-- Column comments and rationale: ../migrations/0001_audit_tables.sql and ../README.md.
-- Apply with: migrate(url, directory=CLUSTER_MIGRATIONS_DIR).

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
    INDEX idx_event_id event_id TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX idx_type type TYPE set(512) GRANULARITY 4
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/events_local', '{replica}')
PARTITION BY toYYYYMM(event_time)
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/transitions_local', '{replica}')
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/violations_local', '{replica}')
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rejections_local', '{replica}')
ORDER BY (source_topic, source_partition, source_offset);

CREATE TABLE IF NOT EXISTS rejections ON CLUSTER '{cluster}' AS rejections_local
ENGINE = Distributed('{cluster}', currentDatabase(), rejections_local, cityHash64(source_topic, source_partition));

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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/snapshots_local', '{replica}')
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/state_digests_local', '{replica}')
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/replay_verdicts_local', '{replica}')
ORDER BY (source_run_id, replay_run_id, record_hash);

CREATE TABLE IF NOT EXISTS replay_verdicts ON CLUSTER '{cluster}' AS replay_verdicts_local
ENGINE = Distributed('{cluster}', currentDatabase(), replay_verdicts_local, cityHash64(source_run_id));
