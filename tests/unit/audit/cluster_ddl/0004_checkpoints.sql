-- Signed checkpoints on a cluster (issue #18); columns and rationale: ../migrations/0004_checkpoints.sql.
CREATE TABLE IF NOT EXISTS checkpoints_local ON CLUSTER '{cluster}'
(
    run_id     String,
    sequence   UInt64,
    key_id     String,
    head_hash  String,
    state_hash String,
    signature  String,
    doc        String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/checkpoints_local', '{replica}')
ORDER BY (run_id, sequence, key_id);

CREATE TABLE IF NOT EXISTS checkpoints ON CLUSTER '{cluster}' AS checkpoints_local
ENGINE = Distributed('{cluster}', currentDatabase(), checkpoints_local, cityHash64(run_id));
