-- Every parked row keeps its own content, and the relay's role parks rows without writing to
-- the dead-letter table itself.
--
-- 1. A producer may reuse an id that was dead-lettered before (an idempotency key, a retried
--    request). Keyed on id, parking the new row kept the old content and dropped the new one.
--    Each dead letter now has its own key (dead_id, in the order rows were parked); id is
--    indexed, not unique.
ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS dead_id bigint GENERATED ALWAYS AS IDENTITY;

DO $$
DECLARE
    pk_name text;
    pk_cols text[];
BEGIN
    SELECT c.conname, array_agg(a.attname::text ORDER BY a.attnum)
    INTO pk_name, pk_cols
    FROM pg_constraint c
    JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
    WHERE c.conrelid = {dead_literal}::regclass AND c.contype = 'p'
    GROUP BY c.conname;
    IF pk_name IS NOT NULL AND pk_cols <> ARRAY['dead_id'] THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {dead_literal}::regclass, pk_name);
        pk_name := NULL;
    END IF;
    IF pk_name IS NULL THEN
        EXECUTE format('ALTER TABLE %s ADD PRIMARY KEY (dead_id)', {dead_literal}::regclass);
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS {name}_dead_id_idx ON {dead} (id);

-- 2. Parking goes through a function, so the relay's role needs no INSERT (or UPDATE) on the
--    dead-letter table: a stolen relay login cannot write a dead letter of its own making and
--    then replay it into the outbox as a message. The function moves outbox rows as they are
--    (content, options and all); the caller names only ids and reasons. Called in the claim's
--    transaction, on rows that transaction has locked.
CREATE OR REPLACE FUNCTION {dead_letter_fn}(p_ids uuid[], p_reasons text[], p_counted boolean[])
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
WITH reasons AS (
    SELECT * FROM unnest(p_ids, p_reasons, p_counted) AS f(id, reason, counted)
), moved AS (
    DELETE FROM {table} AS t USING reasons AS r WHERE t.id = r.id
    RETURNING t.id, t.seq, t.exchange, t.routing_key, t.content, t.options, t.created_at,
              t.available_at,
              -- attempts is producer-writable: the count stops at integer's maximum.
              LEAST(GREATEST(t.attempts, 0), 2147483646)
                  + CASE WHEN r.counted THEN 1 ELSE 0 END AS attempts,
              r.reason AS last_error, t.ordering_key, r.reason
), parked AS (
    INSERT INTO {dead} (id, seq, exchange, routing_key, content, options, created_at,
                        available_at, attempts, last_error, ordering_key, reason)
    SELECT * FROM moved
    RETURNING 1
)
SELECT count(*)::integer FROM parked
$fn$;

REVOKE ALL ON FUNCTION {dead_letter_fn}(uuid[], text[], boolean[]) FROM PUBLIC;

-- 3. Replay moves the latest dead letter of each id (the one parked last); older dead letters
--    of the same id stay, and `relay dead replay` says so.
CREATE OR REPLACE FUNCTION {replay_fn}(p_ids uuid[])
RETURNS SETOF text
LANGUAGE sql VOLATILE SECURITY DEFINER AS $fn$
WITH picked AS (
    SELECT d.dead_id FROM {dead} AS d
    WHERE d.id = ANY(p_ids)
      AND d.content IS NOT NULL AND d.exchange IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.id = d.id)
      AND NOT EXISTS (SELECT 1 FROM {dead} AS later
                      WHERE later.id = d.id AND later.dead_id > d.dead_id)
    ORDER BY d.seq
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM {dead} AS d USING picked AS p WHERE d.dead_id = p.dead_id
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

-- Both definer functions resolve names in the outbox table's schema only, pg_temp last.
DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {table_literal}::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION %s(uuid[], text[], boolean[]) SET search_path = %I, pg_temp',
                   {dead_letter_fn_literal}, nsp);
    EXECUTE format('ALTER FUNCTION %s(uuid[]) SET search_path = %I, pg_temp',
                   {replay_fn_literal}, nsp);
END $$;
