-- Signed checkpoints of the committed log (issue #18): one row per checkpoint record.
-- A plain MergeTree: a row is the exact record (doc), and a sink batch redelivered after a crash may
-- insert it twice; readers take one row per (run_id, sequence, key_id), e.g. with LIMIT 1 BY.
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
ORDER BY (run_id, sequence, key_id);
