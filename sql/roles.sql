-- Least-privilege roles for one outbox table, applied by `relay migrate --roles` (run it as the
-- table's owner or a superuser: it creates roles when missing and grants on the tables).
--
-- Both are group roles (NOLOGIN): give them to login users, for example
--   CREATE ROLE orders_app   LOGIN PASSWORD '...' IN ROLE {producer_role};
--   CREATE ROLE relay_worker LOGIN PASSWORD '...' IN ROLE {relay_role};
-- Re-running is harmless: CREATE is skipped for existing roles, GRANT is idempotent.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {producer_role_literal}) THEN
        CREATE ROLE {producer_role} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- another `relay migrate --roles` created it at the same moment
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {relay_role_literal}) THEN
        CREATE ROLE {relay_role} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END $$;

GRANT USAGE ON SCHEMA {schema} TO {producer_role}, {relay_role};

-- Producers: INSERT of the columns an application sets, and nothing else. They cannot read,
-- change or delete outbox rows, touch dead letters, or write seq (a future seq would break
-- another producer's insert or jump a key's order), attempts, created_at or last_error.
-- (INSERT ... RETURNING would need SELECT on the returned columns: generate the id
-- client-side instead when you need it.) seq is an identity column: its default needs no
-- USAGE on the sequence. REVOKE first, so that re-running replaces a table-wide grant.
REVOKE INSERT ON {table} FROM {producer_role};
GRANT INSERT (id, exchange, routing_key, content, options, ordering_key, available_at,
              fairness_key, repeat)
    ON {table} TO {producer_role};

-- The relay: claim (SELECT ... FOR UPDATE needs UPDATE of one column), reschedule (UPDATE of
-- the four columns it writes, never content, options, exchange or routing key), delete
-- published rows; list and purge dead letters; archive published rows. It cannot write a
-- message: no INSERT on the outbox, and no INSERT or UPDATE on the dead-letter table (whose
-- rows replay turns back into messages). Rows are parked through {dead_letter_fn} and
-- replayed through {replay_fn}, SECURITY DEFINER functions that only move existing rows,
-- content as it is. No DDL, no TRUNCATE, no ownership: `relay migrate` runs as the owner.
-- REVOKE first, so that re-running replaces what older versions of this file granted.
REVOKE INSERT, UPDATE ON {table} FROM {relay_role};
GRANT SELECT, DELETE ON {table} TO {relay_role};
GRANT UPDATE (attempts, last_error, available_at, occurrence_at) ON {table} TO {relay_role};
REVOKE INSERT, UPDATE ON {dead} FROM {relay_role};
GRANT SELECT, DELETE ON {dead} TO {relay_role};
GRANT SELECT, INSERT, DELETE ON {archive} TO {relay_role};
-- A partitioned archive's DEFAULT partition: `relay prune` deletes its old rows directly.
DO $$
BEGIN
    IF to_regclass({archive_default_literal}) IS NOT NULL THEN
        EXECUTE 'GRANT SELECT, DELETE ON {archive_default} TO {relay_role}';
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION {replay_fn}(uuid[]) TO {relay_role};
GRANT EXECUTE ON FUNCTION {dead_letter_fn}(uuid[], text[], boolean[]) TO {relay_role};
-- A relay that finds a backlog the table's statistics do not count has the table analyzed
-- (sql/migrations/0025_statistics_refresh.sql), as its owner.
GRANT EXECUTE ON FUNCTION {analyze_fn}(bigint) TO {relay_role};
-- Where every relay's fills start while a backlog drains (sql/migrations/0027).
GRANT SELECT, UPDATE ON SEQUENCE {fill_frontier} TO {relay_role};
-- The archive's partitions (sql/migrations/0016): made ahead by an archiving relay, dropped by
-- `relay prune`, through definer functions (the relay role has no DDL).
GRANT EXECUTE ON FUNCTION {archive_partitions_fn}(integer) TO {relay_role};
GRANT EXECUTE ON FUNCTION {archive_drop_fn}(timestamptz) TO {relay_role};
-- `relay run` refuses a schema older than it needs: it reads which migrations are applied.
GRANT SELECT ON {migrations} TO {relay_role};
-- Rows for RabbitMQ streams (sql/migrations/0017, docs/streams.md): producers insert a stream
-- and a content, never a slot or a publishing id; the relay gives those, deletes what the
-- broker confirmed, and keeps the slots' leases and the ids given.
REVOKE INSERT ON {stream_table} FROM {producer_role};
GRANT INSERT (id, stream, content) ON {stream_table} TO {producer_role};
REVOKE INSERT, UPDATE ON {stream_table} FROM {relay_role};
GRANT SELECT, DELETE ON {stream_table} TO {relay_role};
GRANT UPDATE (slot, publishing_id) ON {stream_table} TO {relay_role};
GRANT SELECT, INSERT, UPDATE ON {stream_slots}, {stream_seq} TO {relay_role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {stream_relays} TO {relay_role};
-- What the slots' old producer names were used for (0022): read and done with at a takeover.
GRANT SELECT, DELETE ON {stream_legacy} TO {relay_role};
-- Rows that can never be sent are parked and replayed through definer functions (0020): no
-- INSERT on the parked rows' table, whose rows replay turns back into messages.
REVOKE INSERT, UPDATE ON {stream_dead} FROM {relay_role};
GRANT SELECT ON {stream_dead} TO {relay_role};
GRANT EXECUTE ON FUNCTION {stream_park_fn}(uuid[], text) TO {relay_role};
GRANT EXECUTE ON FUNCTION {stream_replay_fn}(uuid[], text) TO {relay_role};

-- Neither role draws from the seq sequence (identity defaults need no grant; settling copies
-- seq): take back what older versions of this file granted.
DO $$
DECLARE
    seq_name text := pg_get_serial_sequence({table_literal}, 'seq');
BEGIN
    IF seq_name IS NOT NULL THEN
        EXECUTE format('REVOKE USAGE ON SEQUENCE %s FROM %I, %I', seq_name,
                       {producer_role_literal}, {relay_role_literal});
    END IF;
END $$;

-- Tables that later capabilities add (relay registry for ordering / single-active mode):
-- granted when present, so one roles file serves every version of the schema.
DO $$
BEGIN
    IF to_regclass({relays_literal}) IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I',
                       {relays_literal}, {relay_role_literal});
    END IF;
END $$
;

-- ============================================================ spark writer
-- Spark jobs (relay.spark.write_outbox) write as their own group role, not as the producer:
-- the idempotent modes merge with ON CONFLICT (id), which needs SELECT on id, and skip ids
-- already archived, which reads the archive's id; the staged mode creates (and drops) its
-- own UNLOGGED staging table in <table>_stage; the copy mode uses a temporary table.
-- Nothing here lets the role read content or touch rows once written.
--   CREATE ROLE nightly_job LOGIN PASSWORD '...' IN ROLE {spark_role};
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {spark_role_literal}) THEN
        CREATE ROLE {spark_role} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END $$;

-- The staged mode's tables live in the outbox's staging schema (sql/migrations/0010): CREATE
-- there, never on the outbox's own schema (REVOKE takes back what older versions granted).
GRANT USAGE ON SCHEMA {schema} TO {spark_role};
REVOKE CREATE ON SCHEMA {schema} FROM {spark_role};
GRANT USAGE, CREATE ON SCHEMA {stage_schema} TO {spark_role};
-- The producer's columns (never seq, attempts, created_at, last_error); REVOKE first, so that
-- re-running replaces a table-wide grant.
REVOKE INSERT ON {table} FROM {spark_role};
GRANT INSERT (id, exchange, routing_key, content, options, ordering_key, available_at)
    ON {table} TO {spark_role};
GRANT SELECT (id) ON {table} TO {spark_role};
GRANT SELECT (id) ON {archive} TO {spark_role};

DO $$
BEGIN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO %I', current_database(),
                   {spark_role_literal});
END $$
