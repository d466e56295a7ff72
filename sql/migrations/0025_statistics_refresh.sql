-- Statistics that say the outbox is empty while a backlog is in it: autovacuum records a drained
-- outbox with reltuples 0, and when it cannot truncate the table (sessions use it) the pages stay,
-- so every plan, fresh or cached, expects no rows however many come next: a claim then walked
-- and sorted the whole backlog (50,000 rows read per claim of 500, 0.13 s; a 300,000-row bulk
-- drained at a quarter of its rate) until autoanalyze came round. A relay whose claims go from
-- short batches to full ones (relay/pg/tablestats.py) calls this, and the table is analyzed
-- when its statistics count fewer rows than p_rows (what one full claim just took); the relay
-- role may not ANALYZE a table it does not own, so the function runs as the table's owner.
-- NULL: another session holds the table's ANALYZE or VACUUM lock (tried for 100 ms).
CREATE OR REPLACE FUNCTION {analyze_fn}(p_rows bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
BEGIN
    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = {table_literal}::regclass)
            >= p_rows THEN
        RETURN false;
    END IF;
    SET LOCAL lock_timeout = '100ms';
    ANALYZE {table};
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN NULL;
END
$fn$;

-- Only roles granted EXECUTE (sql/roles.sql, and below: whoever may claim rows) may call it;
-- names resolve in the table's schema, never through the caller's search_path.
REVOKE ALL ON FUNCTION {analyze_fn}(bigint) FROM PUBLIC;
DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {table_literal}::regclass);
    grantee text;
BEGIN
    EXECUTE format('ALTER FUNCTION %s(bigint) SET search_path = %I, pg_temp',
                   {analyze_fn_literal}, nsp);
    -- The relay role of an older `relay migrate --roles`, under any name: who may reschedule
    -- rows (UPDATE of available_at) claims them.
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_attribute AS att, aclexplode(att.attacl) AS a
        WHERE att.attrelid = {table_literal}::regclass AND att.attname = 'available_at'
          AND a.privilege_type = 'UPDATE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s(bigint) TO %s', {analyze_fn_literal},
                       grantee);
    END LOOP;
END $$;
