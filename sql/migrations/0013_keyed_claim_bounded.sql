-- A keyed claim's cost does not grow with rows it cannot take.
--
-- The claim of 0009 walked every due keyed row, oldest first, keeping only its key's head: a
-- key whose head is not due (retrying, delayed) with a million due rows behind it made every
-- claim visit those million rows before any other key's head, past the statement timeout (the
-- relay then took the claim for a database outage and backed off, and unkeyed rows, claimed in
-- the same statement, stalled too). Here:
-- 1. the walk of due keyed rows (oldest first, heads only, as in 0009) looks at no more than
--    4 x (p_limit + p_max_keys) rows;
-- 2. when it stopped at that bound with room left in the batch, a walk of the keys themselves
--    follows: one probe of the (hashtext(key), key, seq) index per key gives its head, from a
--    random point of the hash order, round to it once, at most 4 x p_max_keys + 64 keys. Keys
--    with many rows behind a head that cannot go cost one probe each.
-- The per-key lock, the run and the byte budget are as in 0009.
CREATE OR REPLACE FUNCTION {claim_keyed_fn}(p_limit integer, p_max_keys integer,
                                            p_block_on_dead boolean, p_max_bytes bigint)
RETURNS TABLE (id text, exchange text, routing_key text, content bytea, options text,
               attempts integer, seq bigint, ordering_key text, created_at_s double precision)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    ns bigint := ({table_literal}::regclass::oid::bigint) << 32;
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
              FROM {table} AS x
              WHERE x.ordering_key IS NOT NULL AND x.available_at <= now()
              ORDER BY x.available_at
              LIMIT row_budget) AS d
        WHERE NOT EXISTS (SELECT 1 FROM {table} AS e
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
                EXIT WHEN (SELECT count(*) FROM (SELECT 1 FROM {table} AS x
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
                FROM {table} AS t
                WHERE t.ordering_key IS NOT NULL
                  AND hashtext(t.ordering_key) >= CASE WHEN wrapped THEN -2147483648
                                                       ELSE start_h END
                ORDER BY hashtext(t.ordering_key), t.ordering_key, t.seq
                LIMIT 1;
            ELSE
                SELECT hashtext(t.ordering_key), t.ordering_key, t.available_at <= now()
                INTO nh, nk, head_due
                FROM {table} AS t
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
            AND EXISTS (SELECT 1 FROM {dead} AS d WHERE d.ordering_key = nk);
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(ns | (nh::bigint & 4294967295));
        -- Under the lock, in a fresh snapshot: the due prefix of the key's rows.
        SELECT array_agg(x.seq ORDER BY x.seq) INTO run
        FROM (SELECT y.seq, bool_and(y.due) OVER (ORDER BY y.seq) AS ok
              FROM (SELECT t.seq, t.available_at <= now() AS due
                    FROM {table} AS t
                    WHERE hashtext(t.ordering_key) = nh AND t.ordering_key = nk
                    ORDER BY t.seq
                    LIMIT remaining) AS y) AS x
        WHERE x.ok;
        CONTINUE WHEN run IS NULL;
        CONTINUE WHEN p_block_on_dead
            AND EXISTS (SELECT 1 FROM {dead} AS d WHERE d.ordering_key = nk);
        taken := 0;
        FOR r IN
            SELECT t.id, t.exchange, t.routing_key, t.content, t.options, t.attempts, t.seq,
                   t.created_at
            FROM {table} AS t
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
$fn$;
