-- Signed checkpoints of the committed log (issue #18): one row per checkpoint record.
-- A plain MergeTree filled exactly once by the sink (natural key (run_id, sequence, key_id), insert
-- deduplication tokens from offset ranges), like every table since 0002: no FINAL on reads.
-- An auditor can re-check every signature from this table and the events table alone
-- (agentlog verify reads the same records from Kafka or an export).
CREATE TABLE IF NOT EXISTS checkpoints
(
    run_id     String,
    sequence   UInt64,
    key_id     String,                                -- sha256 hex of the raw Ed25519 public key
    head_hash  String,
    state_hash String,
    signature  String,                                -- base64 Ed25519 signature over the JCS statement
    doc        String                                 -- JCS JSON of the Checkpoint record
)
ENGINE = MergeTree
ORDER BY (run_id, sequence, key_id)
SETTINGS non_replicated_deduplication_window = 10000;
