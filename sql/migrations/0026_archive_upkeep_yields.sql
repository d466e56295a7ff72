-- Partition upkeep yields to readers of the archive. `CREATE TABLE ... PARTITION OF` (the
-- coming days, every hour from each archiving relay) and `DROP TABLE` of an old day (`relay
-- prune`) take ACCESS EXCLUSIVE on the archive; behind a reader (a pg_dump, a report) they
-- queued with no bound, and every archive INSERT, the settles of archiving relays, queued
-- behind them: a batch held 30 s and was published again. Each DDL of 0016's functions now
-- waits at most 100 ms for its lock (the functions' own lock_timeout, restored when they
-- return) and the call fails with lock_not_available: the relay tries the coming days again a
-- minute later, `relay prune` a few times and then says which lock it could not get.
ALTER FUNCTION {archive_partitions_fn}(integer) SET lock_timeout = '100ms';
ALTER FUNCTION {archive_drop_fn}(timestamptz) SET lock_timeout = '100ms';
