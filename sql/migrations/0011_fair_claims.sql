-- Claims fair between transactions (docs/ordering.md, "Fair between transactions").
--
-- xact: the transaction that inserted the row, written by the column's default, so producers
-- change nothing. A claim takes a small share of due rows from each of the oldest transactions
-- that have any, then fills the batch in seq order: a row committed by a one-row transaction is
-- claimed by the next batch even while a bulk transaction's hundreds of thousands of rows drain.
-- The default is STABLE, so adding the column rewrites nothing: the rows already in the table
-- take this migration's transaction id (one old transaction, drained in seq order as before).
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS xact xid8 NOT NULL DEFAULT pg_current_xact_id();

-- One probe per transaction finds the next one; a transaction's rows are read in seq order from
-- the claim's floor up, so the rows it already moved are not stepped over (relay/pg/seqfloor.py).
CREATE INDEX IF NOT EXISTS {name}_unkeyed_xact_idx
    ON {table} (xact, seq) WHERE ordering_key IS NULL;
