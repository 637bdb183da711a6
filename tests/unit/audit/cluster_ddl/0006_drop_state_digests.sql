-- state_digests on a cluster; rationale: ../migrations/0006_drop_state_digests.sql.
DROP TABLE IF EXISTS state_digests ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS state_digests_local ON CLUSTER '{cluster}' SYNC;
