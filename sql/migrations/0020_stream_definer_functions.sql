-- Parked stream rows (0018) move through SECURITY DEFINER functions, as the outbox's dead
-- letters do (0006, 0014): the relay role has no INSERT on the stream table nor on the parked
-- rows' table, so a stolen relay login can neither forge a message nor park one of its own
-- making and replay it. Each function runs as the table owner and only moves rows that exist,
-- with their stored stream and content.
--
-- Parks stream rows that can never be sent ($1: ids) with reason $2; how many moved.
CREATE OR REPLACE FUNCTION {stream_park_fn}(p_ids uuid[], p_reason text)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
WITH moved AS (
    DELETE FROM {stream_table} WHERE id = ANY (p_ids)
    RETURNING id, stream, content, created_at
), parked AS (
    INSERT INTO {stream_dead} (id, stream, content, created_at, reason)
    SELECT id, stream, content, created_at, p_reason FROM moved
    RETURNING 1
)
SELECT count(*)::int FROM parked
$fn$;

-- `relay dead replay --streams`: moves the matching parked rows ($1: ids, NULL = any; $2: text
-- the reason contains, NULL = any) back into the stream table with their original id; returns
-- the ids moved. A row whose id is in the stream table already stays parked; an id parked
-- more than once moves once (its latest parking), the older entries stay.
CREATE OR REPLACE FUNCTION {stream_replay_fn}(p_ids uuid[], p_reason text)
RETURNS SETOF text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
WITH picked AS (
    SELECT d.dead_id FROM {stream_dead} AS d
    WHERE d.dead_id IN (SELECT max(m.dead_id) FROM {stream_dead} AS m
                        WHERE (p_ids IS NULL OR m.id = ANY (p_ids))
                          AND (p_reason IS NULL OR strpos(lower(m.reason), lower(p_reason)) > 0)
                        GROUP BY m.id)
      AND NOT EXISTS (SELECT 1 FROM {stream_table} AS t WHERE t.id = d.id)
    FOR UPDATE SKIP LOCKED
), back AS (
    DELETE FROM {stream_dead} AS d USING picked AS p WHERE d.dead_id = p.dead_id
    RETURNING d.dead_id, d.id, d.stream, d.content, d.created_at
)
INSERT INTO {stream_table} (id, stream, content, created_at)
SELECT id, stream, content, created_at FROM back ORDER BY dead_id
RETURNING id::text
$fn$;

-- Only roles granted EXECUTE (sql/roles.sql) may call them; names resolve in the stream
-- table's schema, never through the caller's search_path.
REVOKE ALL ON FUNCTION {stream_park_fn}(uuid[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {stream_replay_fn}(uuid[], text) FROM PUBLIC;
DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {stream_literal}::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION %s(uuid[], text) SET search_path = %I, pg_temp',
                   {stream_park_fn_literal}, nsp);
    EXECUTE format('ALTER FUNCTION %s(uuid[], text) SET search_path = %I, pg_temp',
                   {stream_replay_fn_literal}, nsp);
END $$;
