-- The archive by day (docs/operations.md, "Retention"): once the archive is partitioned
-- (`relay migrate --partition-archive`, query archive_partition), it is range-partitioned on
-- published_at, one partition per UTC day, so that retention drops whole partitions (no dead
-- tuples, no vacuum, almost no WAL) instead of deleting rows in batches. This migration only
-- adds the two functions that keep the partitions; on an archive that is not partitioned both
-- do nothing.

-- Creates the archive's daily partitions from today through p_days_ahead days ahead (UTC),
-- those that do not exist yet; returns how many it made. A day already covered (the legacy
-- partition: the archive as it was before partitioning) or with rows in the DEFAULT partition
-- is skipped. Run by `relay migrate` and every hour by each archiving relay (SECURITY DEFINER:
-- the relay role has no DDL); concurrent runs are safe.
CREATE OR REPLACE FUNCTION {archive_partitions_fn}(p_days_ahead integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
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

-- Drops the archive's partitions that hold only rows published before p_before (their upper
-- bound is at or before it); returns their names, oldest first. The DEFAULT partition is never
-- dropped: `relay prune` deletes its old rows in batches.
CREATE OR REPLACE FUNCTION {archive_drop_fn}(p_before timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
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

REVOKE ALL ON FUNCTION {archive_partitions_fn}(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {archive_drop_fn}(timestamptz) FROM PUBLIC;
-- A SECURITY DEFINER function must not resolve names through the caller's search_path.
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
