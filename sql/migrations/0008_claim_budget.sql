-- Per-key ordering's claim function with a byte budget (p_max_bytes): a batch of keyed rows
-- is bounded by bytes as well as rows, so the relay's memory has a ceiling. Content comes as
-- UTF-8 bytes (the message body as it is). The three-argument function of 0005 stays for
-- relays of the previous version during a rolling upgrade.
--
-- Claims the head run of up to p_max_keys keys, at most p_limit rows in all, and stops once
-- the rows taken reach p_max_bytes (the first row is always taken, however large). Locking
-- and run rules as in 0005_ordering_lock_by_oid.sql.
CREATE OR REPLACE FUNCTION {claim_keyed_fn}(p_limit integer, p_max_keys integer,
                                            p_block_on_dead boolean, p_max_bytes bigint)
RETURNS TABLE (id text, exchange text, routing_key text, content bytea, options text,
               attempts integer, seq bigint, ordering_key text, created_at_s double precision)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    ns bigint := ({table_literal}::regclass::oid::bigint) << 32;
    start_h integer := (floor(random() * 4294967296) - 2147483648)::bigint::integer;
    cur_h integer := start_h;
    cur_k text := '';
    wrapped boolean := false;
    probes integer := 0;
    keys_taken integer := 0;
    remaining integer := p_limit;
    used bigint := 0;
    nh integer;
    nk text;
    head_due boolean;
    run bigint[];
    taken integer;
    r record;
BEGIN
    WHILE remaining > 0 AND keys_taken < p_max_keys AND probes < 4 * p_max_keys + 64
          AND used < p_max_bytes LOOP
        probes := probes + 1;
        -- The next key after the cursor, with its head row's due-ness (a cheap pre-check on
        -- this statement's snapshot; re-checked under the lock).
        SELECT hashtext(t.ordering_key), t.ordering_key, t.available_at <= now()
        INTO nh, nk, head_due
        FROM {table} AS t
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
        END IF;
    END LOOP;
END
$fn$;
