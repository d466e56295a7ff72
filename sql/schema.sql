-- The current schema of one outbox table (RELAY_TABLE=queue_message), as `relay migrate` leaves
-- it in a new database: generated with pg_dump --schema-only --no-owner --no-privileges from a
-- database migrated from nothing, and checked against one in every test run
-- (tests/integration/test_schema_file.py, which also writes it again). Read it to see what is
-- there now; change the schema only through a new migration in sql/migrations/.

CREATE SCHEMA queue_message_stage;

CREATE FUNCTION public.queue_message_analyze(p_rows bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
BEGIN
    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = '"queue_message"'::regclass)
            >= p_rows THEN
        RETURN false;
    END IF;
    SET LOCAL lock_timeout = '100ms';
    ANALYZE "queue_message";
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN NULL;
END
$$;

CREATE FUNCTION public.queue_message_archive_drop(p_before timestamp with time zone) RETURNS SETOF text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET lock_timeout TO '100ms'
    AS $$
DECLARE
    part record;
BEGIN
    FOR part IN
        SELECT b.rel, b.relname FROM (
            SELECT c.oid::regclass AS rel, c.relname,
                   substring(pg_get_expr(c.relpartbound, c.oid) FROM ' TO \(''([^'']+)''\)')
                       ::timestamptz AS upper_bound
            FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
            WHERE i.inhparent = '"queue_message_archive"'::regclass) AS b
        WHERE b.upper_bound <= p_before
        ORDER BY b.upper_bound
    LOOP
        EXECUTE format('DROP TABLE %s', part.rel);
        RETURN NEXT part.relname;
    END LOOP;
END
$$;

CREATE FUNCTION public.queue_message_archive_partitions(p_days_ahead integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET lock_timeout TO '100ms'
    AS $$
DECLARE
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = '"queue_message_archive"'::regclass);
    today timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    made integer := 0;
    day timestamptz;
    part text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = '"queue_message_archive"'::regclass) <> 'p' THEN
        RETURN 0;
    END IF;
    FOR i IN 0..LEAST(GREATEST(p_days_ahead, 0), 366) LOOP
        day := today + make_interval(days => i);
        part := 'queue_message_archive' || '_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        IF to_regclass(format('%I.%I', nsp, part)) IS NOT NULL THEN
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                           nsp, part, '"queue_message_archive"', day, day + interval '1 day');
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
$$;

CREATE FUNCTION public.queue_message_claim_fair(p_rows integer, p_floor bigint, p_after xid8 DEFAULT NULL::xid8, p_upto xid8 DEFAULT NULL::xid8) RETURNS SETOF bigint
    LANGUAGE sql
    AS $$
WITH RECURSIVE xacts AS (
    (SELECT h.xact, 1 AS n
     FROM "queue_message" AS h
     WHERE h.ordering_key IS NULL AND h.seq >= p_floor AND p_rows > 1
       AND h.xact > COALESCE(p_after, '0'::xid8)
       AND h.xact <= COALESCE(p_upto, '18446744073709551615'::xid8)
     ORDER BY h.xact DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT t.xact FROM "queue_message" AS t
            WHERE t.ordering_key IS NULL AND t.xact < x.xact AND t.seq >= p_floor
              AND t.xact > COALESCE(p_after, '0'::xid8)
            ORDER BY t.xact DESC
            LIMIT 1), x.n + 1
    FROM xacts AS x
    WHERE x.xact IS NOT NULL AND x.n < LEAST(32, p_rows / 2))
SELECT c.seq
FROM xacts AS x,
     LATERAL (SELECT t.seq FROM "queue_message" AS t
              -- The transaction's first rows from the floor up, then those rows by seq: an
              -- array, so each is one look-up, never a join over the table. The range of
              -- (xact, seq) instead of xact = x.xact: only the (xact, seq) index gives this
              -- order, so no plan walks the seq index (a bulk's rows) to find one
              -- transaction's row.
              WHERE t.seq = ANY(ARRAY(
                        SELECT v.seq FROM "queue_message" AS v
                        WHERE (v.xact, v.seq) >= (x.xact, p_floor)
                          AND v.xact <= x.xact AND v.ordering_key IS NULL
                        ORDER BY v.xact, v.seq
                        LIMIT 64))
                AND t.available_at <= now()
              ORDER BY t.seq
              LIMIT GREATEST(p_rows / 64, 1)
              FOR UPDATE OF t SKIP LOCKED) AS c
WHERE x.xact IS NOT NULL
$$;

CREATE FUNCTION public.queue_message_claim_keyed(p_limit integer, p_max_keys integer, p_block_on_dead boolean) RETURNS TABLE(id text, exchange text, routing_key text, content text, options text, attempts integer, seq bigint, ordering_key text, created_at_s double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    ns bigint := ('"queue_message"'::regclass::oid::bigint) << 32;
    start_h integer := (floor(random() * 4294967296) - 2147483648)::bigint::integer;
    cur_h integer := start_h;
    cur_k text := '';
    wrapped boolean := false;
    probes integer := 0;
    keys_taken integer := 0;
    remaining integer := p_limit;
    nh integer;
    nk text;
    head_due boolean;
    run bigint[];
    taken integer;
    r record;
BEGIN
    WHILE remaining > 0 AND keys_taken < p_max_keys AND probes < 4 * p_max_keys + 64 LOOP
        probes := probes + 1;
        -- The next key after the cursor, with its head row's due-ness (a cheap pre-check on
        -- this statement's snapshot; re-checked under the lock).
        SELECT hashtext(t.ordering_key), t.ordering_key, t.available_at <= now()
        INTO nh, nk, head_due
        FROM "queue_message" AS t
        WHERE t.ordering_key IS NOT NULL
          AND (hashtext(t.ordering_key), t.ordering_key) > (cur_h, cur_k)
        ORDER BY hashtext(t.ordering_key), t.ordering_key, t.seq
        LIMIT 1;
        IF NOT FOUND THEN
            EXIT WHEN wrapped;
            wrapped := true;
            cur_h := -2147483648;
            cur_k := '';
            CONTINUE;
        END IF;
        EXIT WHEN wrapped AND (nh, nk) >= (start_h, '');
        cur_h := nh;
        cur_k := nk;
        CONTINUE WHEN NOT head_due;
        CONTINUE WHEN p_block_on_dead
            AND EXISTS (SELECT 1 FROM "queue_message_dead" AS d WHERE d.ordering_key = nk);
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(ns | (nh::bigint & 4294967295));
        -- Under the lock, in a fresh snapshot: the due prefix of the key's rows.
        SELECT array_agg(x.seq ORDER BY x.seq) INTO run
        FROM (SELECT y.seq, bool_and(y.due) OVER (ORDER BY y.seq) AS ok
              FROM (SELECT t.seq, t.available_at <= now() AS due
                    FROM "queue_message" AS t
                    WHERE hashtext(t.ordering_key) = nh AND t.ordering_key = nk
                    ORDER BY t.seq
                    LIMIT remaining) AS y) AS x
        WHERE x.ok;
        CONTINUE WHEN run IS NULL;
        CONTINUE WHEN p_block_on_dead
            AND EXISTS (SELECT 1 FROM "queue_message_dead" AS d WHERE d.ordering_key = nk);
        taken := 0;
        FOR r IN
            SELECT t.id, t.exchange, t.routing_key, t.content, t.options, t.attempts, t.seq,
                   t.created_at
            FROM "queue_message" AS t
            WHERE t.seq = ANY(run)
            ORDER BY t.seq
            FOR UPDATE SKIP LOCKED
        LOOP
            -- A gap means a row of the run is held by someone else: stop before it.
            EXIT WHEN r.seq <> run[taken + 1];
            taken := taken + 1;
            id := r.id::text;
            exchange := r.exchange;
            routing_key := r.routing_key;
            content := r.content::text;
            options := r.options::text;
            attempts := r.attempts;
            seq := r.seq;
            ordering_key := nk;
            created_at_s := EXTRACT(EPOCH FROM r.created_at)::float8;
            RETURN NEXT;
        END LOOP;
        IF taken > 0 THEN
            keys_taken := keys_taken + 1;
            remaining := remaining - taken;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION public.queue_message_claim_keyed(p_limit integer, p_max_keys integer, p_block_on_dead boolean, p_max_bytes bigint) RETURNS TABLE(id text, exchange text, routing_key text, content bytea, options text, attempts integer, seq bigint, ordering_key text, created_at_s double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    ns bigint := ('"queue_message"'::regclass::oid::bigint) << 32;
    keys_taken integer := 0;
    remaining integer := p_limit;
    used bigint := 0;
    row_budget integer := 4 * (GREATEST(p_limit, 0) + GREATEST(p_max_keys, 0));
    key_budget integer := 4 * GREATEST(p_max_keys, 0) + 64;
    by_keys boolean := false;
    keys_visited integer := 0;
    wrapped boolean := false;
    start_h integer;
    last_h integer;
    last_k text;
    due_heads refcursor;
    heads_open boolean := true;
    taken_keys text[] := '{}';
    nh integer;
    nk text;
    head_due boolean;
    run bigint[];
    taken integer;
    r record;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    OPEN due_heads FOR
        SELECT d.h, d.k
        FROM (SELECT hashtext(x.ordering_key) AS h, x.ordering_key AS k, x.seq, x.available_at
              FROM "queue_message" AS x
              WHERE x.ordering_key IS NOT NULL AND x.available_at <= now()
              ORDER BY x.available_at
              LIMIT row_budget) AS d
        WHERE NOT EXISTS (SELECT 1 FROM "queue_message" AS e
                          WHERE hashtext(e.ordering_key) = d.h AND e.ordering_key = d.k
                            AND e.seq < d.seq)
        ORDER BY d.available_at;
    LOOP
        EXIT WHEN remaining <= 0 OR keys_taken >= p_max_keys OR used >= p_max_bytes;
        IF NOT by_keys THEN
            FETCH due_heads INTO nh, nk;
            IF NOT FOUND THEN
                CLOSE due_heads;
                heads_open := false;
                -- Every due head was seen unless the walk stopped at its bound.
                EXIT WHEN (SELECT count(*) FROM (SELECT 1 FROM "queue_message" AS x
                                                 WHERE x.ordering_key IS NOT NULL
                                                   AND x.available_at <= now()
                                                 LIMIT row_budget) AS c) < row_budget;
                by_keys := true;
                start_h := (floor(random() * 4294967296) - 2147483648)::bigint::integer;
                CONTINUE;
            END IF;
        ELSE
            keys_visited := keys_visited + 1;
            EXIT WHEN keys_visited > key_budget;
            IF last_k IS NULL THEN
                SELECT hashtext(t.ordering_key), t.ordering_key, t.available_at <= now()
                INTO nh, nk, head_due
                FROM "queue_message" AS t
                WHERE t.ordering_key IS NOT NULL
                  AND hashtext(t.ordering_key) >= CASE WHEN wrapped THEN -2147483648
                                                       ELSE start_h END
                ORDER BY hashtext(t.ordering_key), t.ordering_key, t.seq
                LIMIT 1;
            ELSE
                SELECT hashtext(t.ordering_key), t.ordering_key, t.available_at <= now()
                INTO nh, nk, head_due
                FROM "queue_message" AS t
                WHERE t.ordering_key IS NOT NULL
                  AND (hashtext(t.ordering_key), t.ordering_key) > (last_h, last_k)
                ORDER BY hashtext(t.ordering_key), t.ordering_key, t.seq
                LIMIT 1;
            END IF;
            IF NOT FOUND THEN
                EXIT WHEN wrapped;
                wrapped := true;
                last_k := NULL;
                CONTINUE;
            END IF;
            EXIT WHEN wrapped AND nh >= start_h;
            last_h := nh;
            last_k := nk;
            -- A key this call took already (its lock is this transaction's, so it would be
            -- taken again) or whose head cannot go.
            CONTINUE WHEN NOT head_due OR nk = ANY(taken_keys);
        END IF;
        CONTINUE WHEN p_block_on_dead
            AND EXISTS (SELECT 1 FROM "queue_message_dead" AS d WHERE d.ordering_key = nk);
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(ns | (nh::bigint & 4294967295));
        -- Under the lock, in a fresh snapshot: the due prefix of the key's rows.
        SELECT array_agg(x.seq ORDER BY x.seq) INTO run
        FROM (SELECT y.seq, bool_and(y.due) OVER (ORDER BY y.seq) AS ok
              FROM (SELECT t.seq, t.available_at <= now() AS due
                    FROM "queue_message" AS t
                    WHERE hashtext(t.ordering_key) = nh AND t.ordering_key = nk
                    ORDER BY t.seq
                    LIMIT remaining) AS y) AS x
        WHERE x.ok;
        CONTINUE WHEN run IS NULL;
        CONTINUE WHEN p_block_on_dead
            AND EXISTS (SELECT 1 FROM "queue_message_dead" AS d WHERE d.ordering_key = nk);
        taken := 0;
        FOR r IN
            SELECT t.id, t.exchange, t.routing_key, t.content, t.options, t.attempts, t.seq,
                   t.created_at
            FROM "queue_message" AS t
            WHERE t.seq = ANY(run)
            ORDER BY t.seq
            FOR UPDATE SKIP LOCKED
        LOOP
            -- A gap means a row of the run is held by someone else: stop before it.
            EXIT WHEN r.seq <> run[taken + 1];
            -- The byte budget: the batch's first row always goes, then rows while the bytes
            -- so far are under it (the rest of the run follows in a later batch, in order).
            EXIT WHEN used >= p_max_bytes;
            taken := taken + 1;
            id := r.id::text;
            exchange := r.exchange;
            routing_key := r.routing_key;
            content := convert_to(r.content::text, 'UTF8');
            options := r.options::text;
            used := used + COALESCE(octet_length(content), 0) + COALESCE(octet_length(options), 0);
            attempts := GREATEST(r.attempts, 0);
            seq := r.seq;
            ordering_key := nk;
            created_at_s := EXTRACT(EPOCH FROM r.created_at)::float8;
            RETURN NEXT;
        END LOOP;
        IF taken > 0 THEN
            keys_taken := keys_taken + 1;
            remaining := remaining - taken;
            taken_keys := taken_keys || nk;
        END IF;
    END LOOP;
    IF heads_open THEN
        CLOSE due_heads;
    END IF;
END
$$;

CREATE FUNCTION public.queue_message_claim_keys(p_room integer, p_share integer, p_floor bigint, p_from text) RETURNS TABLE(seq bigint, fairness_key text)
    LANGUAGE sql
    AS $$
WITH RECURSIVE fkeys AS (
    (SELECT s.k, 1 AS n, s.wrapped
     FROM (SELECT COALESCE(a.k, b.k) AS k, a.k IS NULL AS wrapped
           FROM (SELECT min(h.fairness_key) AS k FROM "queue_message" AS h
                 WHERE h.ordering_key IS NULL AND h.fairness_key IS NOT NULL
                   AND (p_from IS NULL OR h.fairness_key > p_from)) AS a,
                (SELECT min(h.fairness_key) AS k FROM "queue_message" AS h
                 WHERE h.ordering_key IS NULL AND h.fairness_key IS NOT NULL) AS b
           WHERE p_room >= p_share AND p_share > 0) AS s
     WHERE s.k IS NOT NULL)
    UNION ALL
    SELECT nx.k, f.n + 1, nx.wrapped
    FROM fkeys AS f,
         LATERAL (
             SELECT CASE
                        WHEN a.k IS NOT NULL AND (NOT f.wrapped OR a.k <= p_from) THEN a.k
                        WHEN a.k IS NULL AND NOT f.wrapped AND b.k <= p_from THEN b.k
                    END AS k,
                    f.wrapped OR a.k IS NULL AS wrapped
             FROM (SELECT min(t.fairness_key) AS k FROM "queue_message" AS t
                   WHERE t.ordering_key IS NULL AND t.fairness_key IS NOT NULL
                     AND t.fairness_key > f.k) AS a,
                  (SELECT min(t.fairness_key) AS k FROM "queue_message" AS t
                   WHERE t.ordering_key IS NULL AND t.fairness_key IS NOT NULL) AS b) AS nx
    WHERE f.k IS NOT NULL AND f.n < LEAST(32, p_room / p_share))
SELECT c.seq, f.k
FROM fkeys AS f,
     LATERAL (SELECT t.seq FROM "queue_message" AS t
              WHERE t.seq = ANY(ARRAY(
                        SELECT v.seq FROM "queue_message" AS v
                        WHERE v.fairness_key = f.k AND v.ordering_key IS NULL
                          AND v.seq >= p_floor
                        ORDER BY v.seq
                        LIMIT 64))
                AND t.available_at <= now()
              ORDER BY t.seq
              LIMIT p_share
              FOR UPDATE OF t SKIP LOCKED) AS c
WHERE f.k IS NOT NULL
$$;

CREATE FUNCTION public.queue_message_notify_stmt() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1380273241, TG_RELID::int) THEN
        PERFORM pg_notify('queue_message_notify', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.queue_message_park(p_ids uuid[], p_reasons text[], p_counted boolean[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    parked_n integer;
    first_id uuid;
    first_reason text;
BEGIN
    WITH reasons AS (
        SELECT * FROM unnest(p_ids, p_reasons, p_counted) WITH ORDINALITY AS f(id, reason,
                                                                              counted, n)
    ), moved AS (
        DELETE FROM "queue_message" AS t USING reasons AS r WHERE t.id = r.id
        RETURNING t.id, t.seq, t.exchange, t.routing_key, t.content, t.options, t.created_at,
                  t.available_at,
                  -- attempts is producer-writable: the count stops at integer's maximum.
                  LEAST(GREATEST(t.attempts, 0), 2147483646)
                      + CASE WHEN r.counted THEN 1 ELSE 0 END AS attempts,
                  r.reason AS last_error, t.ordering_key, r.reason, r.n, t.repeat
    ), parked AS (
        INSERT INTO "queue_message_dead" (id, seq, exchange, routing_key, content, options, created_at,
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
            parked_n, 'queue_message', first_id, left(first_reason, 500)
            USING HINT = 'relay dead list shows them; relay dead replay publishes them again';
    END IF;
    RETURN parked_n;
END
$$;

CREATE FUNCTION public.queue_message_repeat_field(p_field integer, p_s text) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $_$
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
            items := "queue_message_repeat_field"(p_field, term);
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
           OR "queue_message_repeat_field"(p_field, term) IS NULL OR term ~ '[-/*]' THEN
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
        items := "queue_message_repeat_field"(p_field, term);
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
        items := "queue_message_repeat_field"(p_field, term);
        IF items IS NULL OR "queue_message_repeat_field"(p_field, rest) IS NULL
           OR term !~ '^([0-9]+|[A-Z]{3})$' OR rest !~ '^([0-9]+|[A-Z]{3})$' THEN
            RETURN NULL;
        END IF;
        a := items[1];
        b := ("queue_message_repeat_field"(p_field, rest))[1];
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
$_$;

CREATE FUNCTION public.queue_message_repeat_problem(p_repeat text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $_$
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
        IF "queue_message_repeat_field"(i, parts[i + 1]) IS NULL THEN
            RETURN 'bad ' || names[i + 1] || ': ' || parts[i + 1];
        END IF;
    END LOOP;
    -- Day of month and day of week must both match when either starts with a star: a day that
    -- no month of the expression has can then never come.
    days := "queue_message_repeat_field"(3, parts[4]);
    months := "queue_message_repeat_field"(4, parts[5]);
    IF (left(parts[4], 1) = '*' OR left(parts[6], 1) = '*')
       AND (SELECT min(d) FROM unnest(days) AS d) > 29
       AND (SELECT min(d) FROM unnest(days) AS d) > (
           SELECT max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m])
           FROM unnest(months) AS m) THEN
        RETURN 'bad day of month: no month of the expression has it';
    END IF;
    RETURN NULL;
END
$_$;

CREATE FUNCTION public.queue_message_repeat_valid(p_repeat text) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    problem text := "queue_message_repeat_problem"(p_repeat);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'repeat %: %', quote_literal(left(p_repeat, 200)), problem
            USING ERRCODE = 'check_violation',
                  HINT = 'an ISO 8601 interval (PT30S) or a cron expression in UTC '
                         '(*/5 * * * *); docs/recurring.md';
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION public.queue_message_replay(p_ids uuid[]) RETURNS SETOF text
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
WITH picked AS (
    SELECT d.dead_id FROM "queue_message_dead" AS d
    WHERE d.id = ANY(p_ids)
      AND d.content IS NOT NULL AND d.exchange IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM "queue_message" AS t WHERE t.id = d.id)
      AND NOT EXISTS (SELECT 1 FROM "queue_message_dead" AS later
                      WHERE later.id = d.id AND later.dead_id > d.dead_id)
    ORDER BY d.seq
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM "queue_message_dead" AS d USING picked AS p WHERE d.dead_id = p.dead_id
    RETURNING d.id, d.seq, d.exchange, d.routing_key, d.content, d.options, d.created_at,
              d.reason, d.ordering_key, d.repeat
)
INSERT INTO "queue_message" (id, exchange, routing_key, content, options, created_at, available_at,
                     attempts, last_error, ordering_key, repeat)
SELECT id, exchange, COALESCE(routing_key, ''), content, options, created_at, now(), 0,
       'replayed from dead letters; was: ' || reason, ordering_key, repeat
FROM moved
ORDER BY seq
RETURNING id::text
$$;

CREATE FUNCTION public.queue_message_stream_notify_stmt() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(1380273241, TG_RELID::int) THEN
        PERFORM pg_notify('queue_message_notify_stream', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.queue_message_stream_park(p_ids uuid[], p_reason text) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
WITH moved AS (
    DELETE FROM "queue_message_stream" WHERE id = ANY (p_ids)
    RETURNING id, stream, content, created_at
), parked AS (
    INSERT INTO "queue_message_stream_dead" (id, stream, content, created_at, reason)
    SELECT id, stream, content, created_at, p_reason FROM moved
    RETURNING 1
)
SELECT count(*)::int FROM parked
$$;

CREATE FUNCTION public.queue_message_stream_replay(p_ids uuid[], p_reason text) RETURNS SETOF text
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
WITH picked AS (
    SELECT d.dead_id FROM "queue_message_stream_dead" AS d
    WHERE d.dead_id IN (SELECT max(m.dead_id) FROM "queue_message_stream_dead" AS m
                        WHERE (p_ids IS NULL OR m.id = ANY (p_ids))
                          AND (p_reason IS NULL OR strpos(lower(m.reason), lower(p_reason)) > 0)
                        GROUP BY m.id)
      AND NOT EXISTS (SELECT 1 FROM "queue_message_stream" AS t WHERE t.id = d.id)
    FOR UPDATE SKIP LOCKED
), back AS (
    DELETE FROM "queue_message_stream_dead" AS d USING picked AS p WHERE d.dead_id = p.dead_id
    RETURNING d.dead_id, d.id, d.stream, d.content, d.created_at
)
INSERT INTO "queue_message_stream" (id, stream, content, created_at)
SELECT id, stream, content, created_at FROM back ORDER BY dead_id
RETURNING id::text
$$;

CREATE TABLE public.queue_message (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    exchange text NOT NULL,
    routing_key text DEFAULT ''::text NOT NULL,
    content jsonb NOT NULL,
    options jsonb,
    seq bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    ordering_key text,
    xact xid8 DEFAULT pg_current_xact_id() NOT NULL,
    fairness_key text,
    repeat text,
    occurrence_at timestamp with time zone,
    CONSTRAINT queue_message_repeat_unkeyed CHECK (((repeat IS NULL) OR (ordering_key IS NULL))),
    CONSTRAINT queue_message_repeat_valid CHECK (((repeat IS NULL) OR public.queue_message_repeat_valid(repeat)))
)
WITH (autovacuum_vacuum_scale_factor='0.0', autovacuum_vacuum_threshold='5000', autovacuum_vacuum_insert_scale_factor='0.0', autovacuum_vacuum_insert_threshold='20000', autovacuum_analyze_scale_factor='0.0', autovacuum_analyze_threshold='10000', autovacuum_vacuum_cost_delay='0');

CREATE TABLE public.queue_message_archive (
    id uuid NOT NULL,
    seq bigint,
    exchange text,
    routing_key text,
    content jsonb,
    options jsonb,
    created_at timestamp with time zone NOT NULL,
    available_at timestamp with time zone NOT NULL,
    attempts integer NOT NULL,
    last_error text,
    ordering_key text,
    published_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.queue_message_dead (
    id uuid NOT NULL,
    seq bigint,
    exchange text,
    routing_key text,
    content jsonb,
    options jsonb,
    created_at timestamp with time zone NOT NULL,
    available_at timestamp with time zone NOT NULL,
    attempts integer NOT NULL,
    last_error text,
    ordering_key text,
    reason text NOT NULL,
    dead_at timestamp with time zone DEFAULT now() NOT NULL,
    dead_id bigint NOT NULL,
    repeat text,
    dead_xact xid8 DEFAULT pg_current_xact_id()
);

ALTER TABLE public.queue_message_dead ALTER COLUMN dead_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.queue_message_dead_dead_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE SEQUENCE public.queue_message_fill_frontier
    START WITH -9223372036854775808
    INCREMENT BY 1
    MINVALUE -9223372036854775808
    NO MAXVALUE
    CACHE 1;

ALTER TABLE public.queue_message ALTER COLUMN seq ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME public.queue_message_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.queue_message_stream (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    seq bigint NOT NULL,
    stream text NOT NULL,
    content jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    slot integer,
    publishing_id bigint,
    CONSTRAINT queue_message_stream_assigned CHECK (((slot IS NULL) = (publishing_id IS NULL))),
    CONSTRAINT queue_message_stream_stream_check CHECK (((stream <> ''::text) AND (octet_length(stream) <= 255)))
);

CREATE TABLE public.queue_message_stream_dead (
    dead_id bigint NOT NULL,
    id uuid NOT NULL,
    stream text NOT NULL,
    content jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL,
    reason text NOT NULL,
    dead_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE public.queue_message_stream_dead ALTER COLUMN dead_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.queue_message_stream_dead_dead_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.queue_message_stream_legacy (
    slot integer NOT NULL,
    stream text NOT NULL,
    last_id bigint NOT NULL
);

CREATE TABLE public.queue_message_stream_relays (
    relay text NOT NULL,
    seen_at timestamp with time zone NOT NULL
);

CREATE TABLE public.queue_message_stream_seq (
    slot integer NOT NULL,
    stream text NOT NULL,
    last_id bigint NOT NULL
);

ALTER TABLE public.queue_message_stream ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.queue_message_stream_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.queue_message_stream_slots (
    slot integer NOT NULL,
    owner text,
    lease_until timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL
);

CREATE TABLE public.relay_migrations (
    target text NOT NULL,
    version text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.queue_message_archive
    ADD CONSTRAINT queue_message_archive_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.queue_message_dead
    ADD CONSTRAINT queue_message_dead_pkey PRIMARY KEY (dead_id);

ALTER TABLE ONLY public.queue_message
    ADD CONSTRAINT queue_message_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.queue_message_stream_dead
    ADD CONSTRAINT queue_message_stream_dead_pkey PRIMARY KEY (dead_id);

ALTER TABLE ONLY public.queue_message_stream_legacy
    ADD CONSTRAINT queue_message_stream_legacy_pkey PRIMARY KEY (slot, stream);

ALTER TABLE public.queue_message_stream
    ADD CONSTRAINT queue_message_stream_name_servable CHECK (((strpos(stream, chr(13)) = 0) AND (strpos(stream, chr(10)) = 0) AND ("left"(stream, 4) <> 'amq.'::text))) NOT VALID;

ALTER TABLE ONLY public.queue_message_stream
    ADD CONSTRAINT queue_message_stream_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.queue_message_stream_relays
    ADD CONSTRAINT queue_message_stream_relays_pkey PRIMARY KEY (relay);

ALTER TABLE ONLY public.queue_message_stream_seq
    ADD CONSTRAINT queue_message_stream_seq_pkey PRIMARY KEY (slot, stream);

ALTER TABLE ONLY public.queue_message_stream_slots
    ADD CONSTRAINT queue_message_stream_slots_pkey PRIMARY KEY (slot);

ALTER TABLE ONLY public.relay_migrations
    ADD CONSTRAINT relay_migrations_pkey PRIMARY KEY (target, version);

CREATE INDEX queue_message_archive_published_at_idx ON public.queue_message_archive USING btree (published_at);

CREATE INDEX queue_message_available_at_idx ON public.queue_message USING btree (available_at);

CREATE INDEX queue_message_dead_dead_at_idx ON public.queue_message_dead USING btree (dead_at);

CREATE INDEX queue_message_dead_id_idx ON public.queue_message_dead USING btree (id);

CREATE INDEX queue_message_dead_key_idx ON public.queue_message_dead USING btree (ordering_key) WHERE (ordering_key IS NOT NULL);

CREATE INDEX queue_message_dead_xact_idx ON public.queue_message_dead USING btree (dead_xact, dead_id);

CREATE INDEX queue_message_fairness_key_idx ON public.queue_message USING btree (fairness_key, seq) WHERE ((ordering_key IS NULL) AND (fairness_key IS NOT NULL));

CREATE INDEX queue_message_key_seq_idx ON public.queue_message USING btree (hashtext(ordering_key), ordering_key, seq) WHERE (ordering_key IS NOT NULL);

CREATE INDEX queue_message_keyed_due_idx ON public.queue_message USING btree (available_at) WHERE (ordering_key IS NOT NULL);

CREATE UNIQUE INDEX queue_message_seq_idx ON public.queue_message USING btree (seq);

CREATE UNIQUE INDEX queue_message_stream_assigned_idx ON public.queue_message_stream USING btree (slot, stream, publishing_id) WHERE (slot IS NOT NULL);

CREATE INDEX queue_message_stream_unassigned_idx ON public.queue_message_stream USING btree (seq) WHERE (slot IS NULL);

CREATE INDEX queue_message_unkeyed_seq_idx ON public.queue_message USING btree (seq) WHERE (ordering_key IS NULL);

CREATE INDEX queue_message_unkeyed_xact_idx ON public.queue_message USING btree (xact, seq) WHERE (ordering_key IS NULL);

CREATE TRIGGER queue_message_notify AFTER INSERT ON public.queue_message FOR EACH STATEMENT EXECUTE FUNCTION public.queue_message_notify_stmt();

COMMENT ON TRIGGER queue_message_notify ON public.queue_message IS 'outbox-relay notify mode: conditional';

CREATE TRIGGER queue_message_stream_notify AFTER INSERT ON public.queue_message_stream FOR EACH STATEMENT EXECUTE FUNCTION public.queue_message_stream_notify_stmt();
