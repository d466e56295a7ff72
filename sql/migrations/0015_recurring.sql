-- Recurring rows (docs/recurring.md): a row whose `repeat` is set is not deleted once
-- published; the settle that confirms it reschedules it at its next time, attempts reset (and,
-- when archiving, archives the occurrence). Deleting the row stops it.
--
-- repeat: an ISO 8601 interval of at least one second (PT30S, P1DT12H; no negative parts), or a
-- cron expression in UTC as Debian's cron reads it: five fields (minute hour day-of-month month
-- day-of-week) or six with seconds first; *, numbers, a-b ranges, /steps, lists, JAN-DEC and
-- SUN-SAT names, L and LW in day-of-month, nL and n#k in day-of-week; printable ASCII only. The
-- table refuses anything else at INSERT, saying what is wrong: the CHECK below reads the
-- expression with the same rules as the relay's parser (cronsim), field by field. A recurring
-- row has no ordering key.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS repeat text;
-- A parked recurring row keeps its schedule: replay puts it back with it.
ALTER TABLE {dead} ADD COLUMN IF NOT EXISTS repeat text;

-- The values one cron field stands for, as cronsim's Field.parse reads it (field 0 seconds,
-- 1 minutes, 2 hours, 3 day of month, 4 month, 5 day of week; upper case); NULL when it is not
-- a field. L and LW stand for -1000 and -1001, nL and n#k for -1.
CREATE OR REPLACE FUNCTION {repeat_field_fn}(p_field integer, p_s text)
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    lo integer := (ARRAY[0, 0, 0, 1, 1, 0])[p_field + 1];
    hi integer := (ARRAY[59, 59, 23, 31, 12, 7])[p_field + 1];
    out integer[] := '{}';
    term text;
    rest text;
    items integer[];
    a numeric;
    b numeric;
    step numeric;
BEGIN
    IF p_s = '*' THEN
        RETURN ARRAY(SELECT generate_series(lo, hi));
    END IF;
    IF position(',' IN p_s) > 0 THEN
        FOREACH term IN ARRAY string_to_array(p_s, ',') LOOP
            items := {repeat_field_fn}(p_field, term);
            IF items IS NULL THEN
                RETURN NULL;
            END IF;
            out := out || items;
        END LOOP;
        RETURN out;
    END IF;
    IF p_field = 5 AND position('L' IN p_s) > 0 THEN
        term := left(p_s, -1);
        IF right(p_s, 1) <> 'L' OR term !~ '^[0-9]+$' OR term::numeric > hi THEN
            RETURN NULL;
        END IF;
        RETURN ARRAY[-1];
    END IF;
    IF p_field = 5 AND position('#' IN p_s) > 0 THEN
        term := split_part(p_s, '#', 1);
        rest := substr(p_s, length(term) + 2);
        IF rest !~ '^[0-9]+$' OR rest::numeric NOT BETWEEN 1 AND 5
           OR {repeat_field_fn}(p_field, term) IS NULL OR term ~ '[-/*]' THEN
            RETURN NULL;
        END IF;
        RETURN ARRAY[-1];
    END IF;
    IF position('/' IN p_s) > 0 THEN
        term := split_part(p_s, '/', 1);
        rest := substr(p_s, length(term) + 2);
        IF rest !~ '^[0-9]+$' OR rest::numeric = 0 THEN
            RETURN NULL;
        END IF;
        items := {repeat_field_fn}(p_field, term);
        IF items IS NULL OR items IN (ARRAY[-1000], ARRAY[-1001]) THEN
            RETURN items;
        END IF;
        IF cardinality(items) = 1 THEN
            RETURN ARRAY(SELECT generate_series(items[1], hi));
        END IF;
        RETURN items;
    END IF;
    IF position('-' IN p_s) > 0 THEN
        term := split_part(p_s, '-', 1);
        rest := substr(p_s, length(term) + 2);
        items := {repeat_field_fn}(p_field, term);
        IF items IS NULL OR {repeat_field_fn}(p_field, rest) IS NULL
           OR term !~ '^([0-9]+|[A-Z]{3})$' OR rest !~ '^([0-9]+|[A-Z]{3})$' THEN
            RETURN NULL;
        END IF;
        a := items[1];
        b := ({repeat_field_fn}(p_field, rest))[1];
        IF b < a THEN
            RETURN NULL;
        END IF;
        RETURN ARRAY(SELECT generate_series(a::integer, b::integer));
    END IF;
    IF p_field = 3 AND p_s = 'LW' THEN
        RETURN ARRAY[-1001];
    END IF;
    IF p_field = 3 AND p_s = 'L' THEN
        RETURN ARRAY[-1000];
    END IF;
    IF p_field = 4 AND p_s IN ('JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP',
                                'OCT', 'NOV', 'DEC') THEN
        RETURN ARRAY[array_position(ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG',
                                          'SEP', 'OCT', 'NOV', 'DEC'], p_s)];
    END IF;
    IF p_field = 5 AND p_s IN ('SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT') THEN
        RETURN ARRAY[array_position(ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'],
                                    p_s) - 1];
    END IF;
    IF p_s !~ '^[0-9]+$' THEN
        RETURN NULL;
    END IF;
    a := p_s::numeric;
    IF a < lo OR a > hi THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY[a::integer];
END
$fn$;

-- What is wrong with a `repeat` value, NULL when nothing is.
CREATE OR REPLACE FUNCTION {repeat_problem_fn}(p_repeat text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    parts text[];
    days integer[];
    months integer[];
    names text[] := ARRAY['second', 'minute', 'hour', 'day of month', 'month', 'day of week'];
    i integer;
BEGIN
    IF p_repeat !~ '^[\x20-\x7e\t]*$' THEN
        RETURN 'only printable ASCII, spaces and tabs';
    END IF;
    parts := regexp_split_to_array(btrim(upper(p_repeat), E' \t'), E'[ \t]+');
    IF parts[1] LIKE 'P%' THEN
        -- ISO 8601, each part a plain number (no sign), at least one second in all.
        IF cardinality(parts) <> 1 OR parts[1] !~
           '^P([0-9]+Y)?([0-9]+M)?([0-9]+W)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\.[0-9]+)?S)?)?$'
           OR parts[1] IN ('P', 'PT') OR right(parts[1], 1) = 'T' THEN
            RETURN 'not an ISO 8601 interval such as PT30S or P1DT12H';
        END IF;
        BEGIN
            IF parts[1]::interval < interval '1 second' THEN
                RETURN 'an interval of at least one second';
            END IF;
        EXCEPTION WHEN others THEN
            RETURN 'not an interval: ' || SQLERRM;
        END;
        RETURN NULL;
    END IF;
    IF cardinality(parts) = 5 THEN
        parts := ARRAY['0'] || parts;
    END IF;
    IF cardinality(parts) <> 6 THEN
        RETURN 'a cron expression has five fields, or six with seconds first';
    END IF;
    FOR i IN 0..5 LOOP
        IF {repeat_field_fn}(i, parts[i + 1]) IS NULL THEN
            RETURN 'bad ' || names[i + 1] || ': ' || parts[i + 1];
        END IF;
    END LOOP;
    -- Day of month and day of week must both match when either starts with a star: a day that
    -- no month of the expression has can then never come.
    days := {repeat_field_fn}(3, parts[4]);
    months := {repeat_field_fn}(4, parts[5]);
    IF (left(parts[4], 1) = '*' OR left(parts[6], 1) = '*')
       AND (SELECT min(d) FROM unnest(days) AS d) > 29
       AND (SELECT min(d) FROM unnest(days) AS d) > (
           SELECT max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m])
           FROM unnest(months) AS m) THEN
        RETURN 'bad day of month: no month of the expression has it';
    END IF;
    RETURN NULL;
END
$fn$;

-- The table's CHECK: true, or an error that says what is wrong with the value.
CREATE OR REPLACE FUNCTION {repeat_valid_fn}(p_repeat text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    problem text := {repeat_problem_fn}(p_repeat);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'repeat %: %', quote_literal(left(p_repeat, 200)), problem
            USING ERRCODE = 'check_violation',
                  HINT = 'an ISO 8601 interval (PT30S) or a cron expression in UTC '
                         '(*/5 * * * *); docs/recurring.md';
    END IF;
    RETURN true;
END
$fn$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = {table_literal}::regclass
                     AND conname = '{name}_repeat_valid') THEN
        -- NOT VALID: no scan while this migration holds the table (rows before it have no
        -- repeat); validated after the commit, below.
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (repeat IS NULL OR %s(repeat)) '
                       'NOT VALID', {table_literal}, '{name}_repeat_valid',
                       {repeat_valid_fn_literal});
    END IF;
    -- A recurring row has no ordering key: between its occurrences it would hold every later
    -- row of its key behind it.
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = {table_literal}::regclass
                     AND conname = '{name}_repeat_unkeyed') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I '
                       'CHECK (repeat IS NULL OR ordering_key IS NULL) NOT VALID',
                       {table_literal}, '{name}_repeat_unkeyed');
    END IF;
END $$;

-- Parking keeps the schedule (0014's function, with repeat).
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
                  r.reason AS last_error, t.ordering_key, r.reason, r.n, t.repeat
    ), parked AS (
        INSERT INTO {dead} (id, seq, exchange, routing_key, content, options, created_at,
                            available_at, attempts, last_error, ordering_key, reason, repeat)
        SELECT id, seq, exchange, routing_key, content, options, created_at, available_at,
               attempts, last_error, ordering_key, reason, repeat
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

-- Replay puts a recurring row back with its schedule (0007's function, with repeat).
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
              d.reason, d.ordering_key, d.repeat
)
INSERT INTO {table} (id, exchange, routing_key, content, options, created_at, available_at,
                     attempts, last_error, ordering_key, repeat)
SELECT id, exchange, COALESCE(routing_key, ''), content, options, created_at, now(), 0,
       'replayed from dead letters; was: ' || reason, ordering_key, repeat
FROM moved
ORDER BY seq
RETURNING id::text
$fn$;

-- CREATE OR REPLACE resets a function's settings: pin both definer functions' search_path to
-- the outbox table's schema again, pg_temp last.
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

-- relay: outside the transaction
ALTER TABLE {table} VALIDATE CONSTRAINT {name}_repeat_valid;
ALTER TABLE {table} VALIDATE CONSTRAINT {name}_repeat_unkeyed;
