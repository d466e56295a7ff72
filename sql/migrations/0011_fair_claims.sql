-- Claims fair between transactions (docs/ordering.md, "Fair between transactions").
--
-- xact: the transaction that inserted the row, written by the column's default, so producers
-- change nothing. A claim takes a small share of due rows from each of the oldest transactions
-- that have any, then fills the batch in seq order: a row committed by a one-row transaction is
-- claimed by the next batch even while a bulk transaction's hundreds of thousands of rows drain.
-- The default is STABLE, so adding the column rewrites nothing: the rows already in the table
-- take this migration's transaction id (one old transaction, drained in seq order as before).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS xact xid8 NOT NULL DEFAULT pg_current_xact_id();

-- The fair round of a claim (query `claim`; query `claim_express` runs it alone): locks and
-- returns the seqs of a share of due unkeyed rows from each of the newest transactions that
-- have rows from seq p_floor up: LEAST(32, p_rows / 2) transactions, GREATEST(p_rows / 64, 1)
-- rows each, so at most half of p_rows. NULL p_rows: none. p_after: only transactions newer
-- than this one (the express lane: those that committed since its drain began; NULL: all), a
-- bound of the index scans, so the transactions before it are never walked; p_upto: only
-- transactions up to this one (the drain's own batches while the express lane takes the newer
-- ones; NULL: all).
-- Each transaction is one index probe from the one before (newest first), and its share is
-- found among its first 64 rows from the floor up: a delayed or locked bulk costs one short
-- look, not a walk.
CREATE OR REPLACE FUNCTION {claim_fair_fn}(p_rows integer, p_floor bigint,
                                           p_after xid8 DEFAULT NULL, p_upto xid8 DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql VOLATILE AS $fn$
WITH RECURSIVE xacts AS (
    (SELECT h.xact, 1 AS n
     FROM {table} AS h
     WHERE h.ordering_key IS NULL AND h.seq >= p_floor AND p_rows > 1
       AND h.xact > COALESCE(p_after, '0'::xid8)
       AND h.xact <= COALESCE(p_upto, '18446744073709551615'::xid8)
     ORDER BY h.xact DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT t.xact FROM {table} AS t
            WHERE t.ordering_key IS NULL AND t.xact < x.xact AND t.seq >= p_floor
              AND t.xact > COALESCE(p_after, '0'::xid8)
            ORDER BY t.xact DESC
            LIMIT 1), x.n + 1
    FROM xacts AS x
    WHERE x.xact IS NOT NULL AND x.n < LEAST(32, p_rows / 2))
SELECT c.seq
FROM xacts AS x,
     LATERAL (SELECT t.seq FROM {table} AS t
              -- The transaction's first rows from the floor up, then those rows by seq: an
              -- array, so each is one look-up, never a join over the table. The range of
              -- (xact, seq) instead of xact = x.xact: only the (xact, seq) index gives this
              -- order, so no plan walks the seq index (a bulk's rows) to find one
              -- transaction's row.
              WHERE t.seq = ANY(ARRAY(
                        SELECT v.seq FROM {table} AS v
                        WHERE (v.xact, v.seq) >= (x.xact, p_floor)
                          AND v.xact <= x.xact AND v.ordering_key IS NULL
                        ORDER BY v.xact, v.seq
                        LIMIT 64))
                AND t.available_at <= now()
              ORDER BY t.seq
              LIMIT GREATEST(p_rows / 64, 1)
              FOR UPDATE OF t SKIP LOCKED) AS c
WHERE x.xact IS NOT NULL
$fn$;

-- One probe per transaction finds the next one; a transaction's rows are read in seq order from
-- the claim's floor up, so the rows it already moved are not stepped over (relay/pg/seqfloor.py).
-- Built CONCURRENTLY, after the rest of this migration commits: on a live outbox with a large
-- backlog a plain build would hold producers' INSERTs for as long as it takes.
-- relay: outside the transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS {name}_unkeyed_xact_idx
    ON {table} (xact, seq) WHERE ordering_key IS NULL;
