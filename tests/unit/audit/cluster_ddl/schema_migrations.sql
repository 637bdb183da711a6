-- Bootstrap for the cluster variant: the ledger is replicated to every node (one shard's worth of rows).
CREATE TABLE IF NOT EXISTS schema_migrations ON CLUSTER '{cluster}'
(
    version    UInt32,
    name       String,
    checksum   String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/schema_migrations', '{replica}')
ORDER BY version;
