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

-- Producers: INSERT and nothing else. They cannot read, change or delete outbox rows, and
-- cannot touch dead letters. (INSERT ... RETURNING would need SELECT on the returned columns:
-- generate the id client-side instead when you need it.)
GRANT INSERT ON {table} TO {producer_role};

-- The relay: claim (SELECT ... FOR UPDATE needs UPDATE), reschedule, delete published rows;
-- INSERT for `relay dead replay`, which puts dead letters back; the dead-letter and archive
-- tables for settling, listing, replaying and purging. No DDL, no TRUNCATE, no ownership:
-- `relay migrate` runs as the owner, not as this role.
GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {relay_role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {dead} TO {relay_role};
GRANT SELECT, INSERT, DELETE ON {archive} TO {relay_role};
-- `relay run` refuses a schema older than it needs: it reads which migrations are applied.
GRANT SELECT ON {migrations} TO {relay_role};

-- The seq identity's sequence: producers draw from it on INSERT; replay draws from it too.
DO $$
DECLARE
    seq_name text := pg_get_serial_sequence({table_literal}, 'seq');
BEGIN
    IF seq_name IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I, %I', seq_name,
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
