-- The audit sink's ledger keeps EVERY offset range it inserts (issue 14), appended, never replaced.
-- 0002's sink_offsets kept only the newest range per partition (ReplacingMergeTree(hi)), so a range
-- that was skipped or half-written before the newest one left no trace. With all ranges kept, a gap
-- between two ranges of a partition is visible (processors/worker/sink.py, LEDGER_GAPS), and the
-- sink's resume point is still argMax(lo, hi). A range is recorded BEFORE its rows are inserted; a
-- range recorded twice (a re-formed batch, a rebalance) is harmless: the check looks for gaps only.
-- sink_offsets stays as it is: a store upgraded from 0002 resumes from the newer of the two tables.
CREATE TABLE IF NOT EXISTS sink_ranges
(
    topic      LowCardinality(String),
    partition  Int32,
    lo         Int64,
    hi         Int64,
    written_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = MergeTree
ORDER BY (topic, partition, lo, hi);
