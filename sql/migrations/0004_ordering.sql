-- Per-key ordering (docs/ordering.md). Rows that share an ordering_key are claimed by one
-- relay at a time, head first, through {claim_keyed_fn}; unkeyed rows keep the plain
-- `ORDER BY seq ... SKIP LOCKED` claim.

-- Unkeyed claims walk only unkeyed rows: without this they would step over every keyed row.
CREATE INDEX IF NOT EXISTS {name}_unkeyed_seq_idx ON {table} (seq) WHERE ordering_key IS NULL;

-- Keys are visited in hashtext(key) order from a random point (fair, no hot-key hogging); the
-- first index entry of a key is its head row (lowest seq).
CREATE INDEX IF NOT EXISTS {name}_key_seq_idx
    ON {table} (hashtext(ordering_key), ordering_key, seq) WHERE ordering_key IS NOT NULL;

-- RELAY_ORDERING_ON_DEAD=block: a key with a dead letter stays blocked until that dead letter
-- is removed (replayed or purged).
CREATE INDEX IF NOT EXISTS {name}_dead_key_idx ON {dead} (ordering_key)
    WHERE ordering_key IS NOT NULL;

-- Claims the head run of up to p_max_keys keys, at most p_limit rows in all.
--
-- Per key: a transaction-level advisory lock (namespace: this table, key: hashtext(key); two
-- keys that collide merely share a lock) makes one transaction the key's only claimer. The
-- run is read AFTER the lock is held, by a new statement and so a new snapshot (READ
-- COMMITTED, VOLATILE function): Postgres releases a lock only after its transaction became
-- visible, so the run always reflects the previous holder's deletes and reschedules. The run
-- is the key's rows from its head in seq order, cut at the first row not yet due (a retrying
-- or delayed head holds back the whole key) and at the first row locked by anyone else.
CREATE OR REPLACE FUNCTION {claim_keyed_fn}(p_limit integer, p_max_keys integer,
                                            p_block_on_dead boolean)
RETURNS TABLE (id text, exchange text, routing_key text, content text, options text,
               attempts integer, seq bigint, ordering_key text, created_at_s double precision)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    ns integer := hashtext('outbox-relay:ordering:' || {table_literal});
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
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(ns, nh);
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
$fn$;
