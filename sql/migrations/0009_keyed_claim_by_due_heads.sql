-- The keyed claim finds a due key however many keys wait.
--
-- The claim of 0005/0008 walked the keys from a random point of the hash order and gave up
-- after 4 x p_max_keys + 64 of them: with tens of thousands of keys whose head row is delayed
-- (retrying, or due tomorrow), a due key was found by chance, minutes or hours late. Here the
-- candidates come from the due keyed rows themselves (a partial index on available_at: rows
-- not due are never visited), oldest due first, each kept only when it is its key's head (no
-- earlier row of the key); the per-key lock, the run and the byte budget are as in 0008.
CREATE INDEX IF NOT EXISTS {name}_keyed_due_idx ON {table} (available_at)
    WHERE ordering_key IS NOT NULL;

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
    nh integer;
    nk text;
    run bigint[];
    taken integer;
    cand record;
    r record;
BEGIN
    FOR cand IN
        SELECT hashtext(h.ordering_key) AS h, h.ordering_key AS k
        FROM {table} AS h
        WHERE h.ordering_key IS NOT NULL AND h.available_at <= now()
          AND NOT EXISTS (SELECT 1 FROM {table} AS e
                          WHERE hashtext(e.ordering_key) = hashtext(h.ordering_key)
                            AND e.ordering_key = h.ordering_key AND e.seq < h.seq)
        ORDER BY h.available_at
    LOOP
        EXIT WHEN remaining <= 0 OR keys_taken >= p_max_keys OR used >= p_max_bytes;
        nh := cand.h;
        nk := cand.k;
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
