-- `relay dead watch` reads only what is new: each dead letter records the transaction that
-- parked it, and the watch keeps a cursor on that order (relay/pg/deadwatch.py). A letter whose
-- transaction is older than every transaction still running (the snapshot's xmin) is final, so
-- each look reads from the last look's xmin on. Before, a dead letter's only order was dead_at
-- (its transaction's start, which can commit after later ones), and every look read the last
-- ten minutes of letters again: in a storm of parked rows each wake-up cost more than the last.
-- Nullable without a default first, then the default: letters already parked keep NULL (the
-- watch finds them by --since), and the table is not rewritten.
ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS dead_xact xid8;
ALTER TABLE {dead} ALTER COLUMN dead_xact SET DEFAULT pg_current_xact_id();

-- relay: outside the transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}_dead_xact_idx ON {dead} (dead_xact, dead_id);
