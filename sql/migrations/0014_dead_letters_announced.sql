-- A parked row is announced in the server's log: the dead-letter function of 0007 raises one
-- WARNING per call (one settle of the relay, however many rows it parks) with the table, the
-- number of rows, the first row's id and its reason (at most 500 characters), so alerting that
-- watches PostgreSQL's log learns of it at once. The NOTIFY on the dead-letter channel is sent
-- by the statement that calls it (query dead_letter), which knows the relay's channel.
-- The rows move as in 0007; the function keeps its owner, grants and search_path.
CREATE OR REPLACE FUNCTION {dead_letter_fn}(p_ids uuid[], p_reasons text[], p_counted boolean[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
DECLARE
    parked_n integer;
    first_id uuid;
    first_reason text;
BEGIN
    WITH reasons AS (
        SELECT * FROM unnest(p_ids, p_reasons, p_counted) WITH ORDINALITY AS f(id, reason,
                                                                              counted, n)
    ), moved AS (
        DELETE FROM {table} AS t USING reasons AS r WHERE t.id = r.id
        RETURNING t.id, t.seq, t.exchange, t.routing_key, t.content, t.options, t.created_at,
                  t.available_at,
                  -- attempts is producer-writable: the count stops at integer's maximum.
                  LEAST(GREATEST(t.attempts, 0), 2147483646)
                      + CASE WHEN r.counted THEN 1 ELSE 0 END AS attempts,
                  r.reason AS last_error, t.ordering_key, r.reason, r.n
    ), parked AS (
        INSERT INTO {dead} (id, seq, exchange, routing_key, content, options, created_at,
                            available_at, attempts, last_error, ordering_key, reason)
        SELECT id, seq, exchange, routing_key, content, options, created_at, available_at,
               attempts, last_error, ordering_key, reason
        FROM moved
        RETURNING id, reason
    )
    SELECT count(*)::integer, (array_agg(p.id ORDER BY m.n))[1],
           (array_agg(p.reason ORDER BY m.n))[1]
    INTO parked_n, first_id, first_reason
    FROM parked AS p JOIN moved AS m ON m.id = p.id;
    IF parked_n > 0 THEN
        RAISE WARNING 'outbox-relay parked % row(s) of %: first id %, reason: %',
            parked_n, {table_name_literal}, first_id, left(first_reason, 500)
            USING HINT = 'relay dead list shows them; relay dead replay publishes them again';
    END IF;
    RETURN parked_n;
END
$fn$;

DO $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {table_literal}::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION %s(uuid[], text[], boolean[]) SET search_path = %I, pg_temp',
                   {dead_letter_fn_literal}, nsp);
END $$;
