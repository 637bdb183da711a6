-- Every log record carries the state hash at its index (events.state_hash, written by the sink from
-- the record's stateHash). state_digests held those hashes for log format 1, whose records had none;
-- agentlog neither writes nor reads that format, so nothing writes or reads this table.
DROP TABLE IF EXISTS state_digests;
