-- `relay dead replay` through a function instead of an INSERT grant: the relay role may not
-- insert into the outbox (a stolen relay login cannot forge messages), yet it can move its
-- own dead letters back. SECURITY DEFINER runs the move as the table owner; the function
-- takes only ids, and moves only rows that are in the dead-letter table, with their stored
-- content: it cannot write anything that was not already an outbox row.
--
-- Moves the given dead letters back into the outbox with their original id (the message_id
-- stays the same), attempts reset and due now; returns the ids moved. Rows whose content or
-- exchange is NULL, or whose id is already in the outbox, stay where they are.
CREATE OR REPLACE FUNCTION {replay_fn}(p_ids uuid[])
RETURNS SETOF text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
WITH picked AS (
    SELECT d.id FROM {dead} AS d
    WHERE d.id = ANY(p_ids)
      AND d.content IS NOT NULL AND d.exchange IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.id = d.id)
    ORDER BY d.seq
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {dead} AS d USING picked AS p WHERE d.id = p.id
    RETURNING d.id, d.seq, d.exchange, d.routing_key, d.content, d.options, d.created_at,
              d.reason, d.ordering_key
)
INSERT INTO {table} (id, exchange, routing_key, content, options, created_at, available_at,
                     attempts, last_error, ordering_key)
SELECT id, exchange, COALESCE(routing_key, ''), content, options, created_at, now(), 0,
       'replayed from dead letters; was: ' || reason, ordering_key
FROM moved
ORDER BY seq
RETURNING id::text
$fn$;

-- Functions are executable by PUBLIC by default: only roles granted EXECUTE (sql/roles.sql)
-- may call this one.
REVOKE ALL ON FUNCTION {replay_fn}(uuid[]) FROM PUBLIC;

-- A SECURITY DEFINER function must not resolve names through the caller's search_path: pin it
-- to the outbox table's schema, pg_temp last.
DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {table_literal}::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION %s(uuid[]) SET search_path = %I, pg_temp',
                   {replay_fn_literal}, nsp);
END $$;
