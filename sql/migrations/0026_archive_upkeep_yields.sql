-- Partition upkeep yields to readers of the archive. `CREATE TABLE ... PARTITION OF` (the
-- coming days, every hour from each archiving relay) and `DROP TABLE` of an old day (`relay
-- prune`) take ACCESS EXCLUSIVE on the archive; behind a reader (a pg_dump, a report) they
-- queued with no bound, and every archive INSERT, the settles of archiving relays, queued
-- behind them: a batch held 30 s and was published again. Each DDL now waits at most 100 ms
-- for its lock (the function's own lock_timeout, restored when it returns) and the function
-- fails with lock_not_available: the relay tries the coming days again a minute later, `relay
-- prune` a few times and then says which lock it could not get. The bodies are 0016's.
CREATE OR REPLACE FUNCTION {archive_partitions_fn}(p_days_ahead integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET lock_timeout = '100ms' AS $fn$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {archive_literal}::regclass);
    today timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    made integer := 0;
    day timestamptz;
    part text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = {archive_literal}::regclass) <> 'p' THEN
        RETURN 0;
    END IF;
    FOR i IN 0..LEAST(GREATEST(p_days_ahead, 0), 366) LOOP
        day := today + make_interval(days => i);
        part := {archive_name_literal} || '_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(format('%I.%I', nsp, part)) IS NOT NULL THEN
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           nsp, part, {archive_literal}, day, day + interval '1 day');
            made := made + 1;
        EXCEPTION
            -- covered by the legacy partition, rows of that day in DEFAULT, or another relay
            -- made it a moment ago
            WHEN invalid_object_definition OR check_violation OR duplicate_table
                 OR unique_violation THEN
                NULL;
        END;
    END LOOP;
    RETURN made;
END
$fn$;

CREATE OR REPLACE FUNCTION {archive_drop_fn}(p_before timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET lock_timeout = '100ms' AS $fn$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT b.rel, b.relname FROM (
            SELECT c.oid::regclass AS rel, c.relname,
                   substring(pg_get_expr(c.relpartbound, c.oid) FROM ' TO \(''([^'']+)''\)')
                       ::timestamptz AS upper_bound
            FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
            WHERE i.inhparent = {archive_literal}::regclass) AS b
        WHERE b.upper_bound <= p_before
        ORDER BY b.upper_bound
    LOOP
        EXECUTE format('DROP TABLE %s', part.rel);
        RETURN NEXT part.relname;
    END LOOP;
END
$fn$;

-- CREATE OR REPLACE keeps the grants but not the search_path 0016 pinned: pinned again.
DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {table_literal}::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION %s(integer) SET search_path = %I, pg_temp',
                   {archive_partitions_fn_literal}, nsp);
    EXECUTE format('ALTER FUNCTION %s(timestamptz) SET search_path = %I, pg_temp',
                   {archive_drop_fn_literal}, nsp);
END $$;
