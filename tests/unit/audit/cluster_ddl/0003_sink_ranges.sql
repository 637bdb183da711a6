-- Cluster variant of ../migrations/0003_sink_ranges.sql: every range the sink inserts, appended.
CREATE TABLE IF NOT EXISTS sink_ranges_local ON CLUSTER '{cluster}'
(
    topic      LowCardinality(String),
    partition  Int32,
    lo         Int64,
    hi         Int64,
    written_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/sink_ranges_local', '{replica}')
ORDER BY (topic, partition, lo, hi);

CREATE TABLE IF NOT EXISTS sink_ranges ON CLUSTER '{cluster}' AS sink_ranges_local
ENGINE = Distributed('{cluster}', currentDatabase(), sink_ranges_local, cityHash64(topic));
