-- Claims fair between producers' fairness keys too (docs/fairness.md, "A fairness key").
--
-- fairness_key: optional, written by producers that want it (a tenant, a source, "backfill");
-- NULL for everyone else, so adding it rewrites nothing. Among unkeyed rows (no ordering_key),
-- each claim also takes a share of due rows from each of up to 32 fairness keys, in turn, so one
-- key's burst of many transactions cannot hold back another key's rows.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS fairness_key text;

-- The fairness keys' round of a claim (query `claim`): locks and returns the seqs (with their
-- key) of up to p_share due unkeyed rows, lowest seq first, from each of up to
-- LEAST(32, p_room / p_share) fairness keys. NULL p_room: none. Keys are visited in text order
-- from the first one after p_from (NULL: from the first key), round to the beginning and up to
-- p_from again, so that with more keys than one claim visits, the next claim (given the last
-- key this one served) goes on where this one stopped. Each key is one probe of the
-- (fairness_key, seq) index from the one before, and its share is found among its first 64
-- rows from p_floor up.
CREATE OR REPLACE FUNCTION {claim_keys_fn}(p_room integer, p_share integer, p_floor bigint,
                                           p_from text)
RETURNS TABLE(seq bigint, fairness_key text)
LANGUAGE sql VOLATILE AS $fn$
WITH RECURSIVE fkeys AS (
    (SELECT s.k, 1 AS n, s.wrapped
     FROM (SELECT COALESCE(a.k, b.k) AS k, a.k IS NULL AS wrapped
           FROM (SELECT min(h.fairness_key) AS k FROM {table} AS h
                 WHERE h.ordering_key IS NULL AND h.fairness_key IS NOT NULL
                   AND (p_from IS NULL OR h.fairness_key > p_from)) AS a,
                (SELECT min(h.fairness_key) AS k FROM {table} AS h
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
             FROM (SELECT min(t.fairness_key) AS k FROM {table} AS t
                   WHERE t.ordering_key IS NULL AND t.fairness_key IS NOT NULL
                     AND t.fairness_key > f.k) AS a,
                  (SELECT min(t.fairness_key) AS k FROM {table} AS t
                   WHERE t.ordering_key IS NULL AND t.fairness_key IS NOT NULL) AS b) AS nx
    WHERE f.k IS NOT NULL AND f.n < LEAST(32, p_room / p_share))
SELECT c.seq, f.k
FROM fkeys AS f,
     LATERAL (SELECT t.seq FROM {table} AS t
              WHERE t.seq = ANY(ARRAY(
                        SELECT v.seq FROM {table} AS v
                        WHERE v.fairness_key = f.k AND v.ordering_key IS NULL
                          AND v.seq >= p_floor
                        ORDER BY v.seq
                        LIMIT 64))
                AND t.available_at <= now()
              ORDER BY t.seq
              LIMIT p_share
              FOR UPDATE OF t SKIP LOCKED) AS c
WHERE f.k IS NOT NULL
$fn$;

-- One probe per key finds the next one; a key's rows are read in seq order from the claim's
-- floor up. Built CONCURRENTLY after the transaction (see 0011).
-- relay: outside the transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}_fairness_key_idx
    ON {table} (fairness_key, seq) WHERE ordering_key IS NULL AND fairness_key IS NOT NULL;
