-- The express lane's look between claims (query `newest_transaction`, relay/loop/express.py),
-- every few milliseconds while a backlog drains: the newest transaction that has unkeyed rows,
-- one entry at the end of the (xact, seq) index. As a plain statement it has no parameters, so
-- the server plans it once per session and keeps that plan; one made while the statistics said
-- the table was empty (autovacuum after a quiet spell, a fresh database) read and sorted every
-- unkeyed row on each look until the next ANALYZE (50,000 rows a look, measured). Here the
-- function's own settings leave the backward walk of that index as the only plan, whatever the
-- statistics say.
CREATE OR REPLACE FUNCTION {newest_xact_fn}() RETURNS xid8
LANGUAGE sql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
AS $fn$
SELECT t.xact FROM {table} AS t WHERE t.ordering_key IS NULL ORDER BY t.xact DESC LIMIT 1
$fn$;
