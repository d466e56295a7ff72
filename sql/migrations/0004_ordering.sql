-- Per-key ordering (docs/ordering.md). Rows that share an ordering_key are claimed by one
-- relay at a time, head first, through {claim_keyed_fn}; unkeyed rows keep the plain
-- `ORDER BY seq ... SKIP LOCKED` claim.

-- Unkeyed claims walk only unkeyed rows: without this they would step over every keyed row.
CREATE INDEX IF NOT EXISTS {name}_unkeyed_seq_idx ON {table} (seq) WHERE ordering_key IS NULL;

-- Keys are visited in hashtext(key) order from a random point (fair, no hot-key hogging); the
-- first index entry of a key is its head row (lowest seq).
CREATE INDEX IF NOT EXISTS {name}_key_seq_idx
    ON {table} (hashtext(ordering_key), ordering_key, seq) WHERE ordering_key IS NOT NULL;

-- RELAY_ORDERING_ON_DEAD=block: a key with a dead letter stays blocked until that dead letter
-- is removed (replayed or purged).
CREATE INDEX IF NOT EXISTS {name}_dead_key_idx ON {dead} (ordering_key)
    WHERE ordering_key IS NOT NULL;

-- The claim function {claim_keyed_fn} is created by 0005_ordering_lock_by_oid.sql.
