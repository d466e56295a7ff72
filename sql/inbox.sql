-- The consumer's inbox (relay/inbox/): every statement it runs, each under a `-- name:` header.
-- It lives in the consumer's own database, not the outbox's. {inbox} is the quoted table,
-- {inbox_index} the quoted name of its index on received_at, {inbox_literal} the table as a
-- string literal. docs/inbox.md shows the same statements for consumers in other languages.

-- name: inbox_create
-- `relay inbox migrate`: idempotent. One row per message a consumer has handled; the key is the
-- consumer's name (so that two consumers of one database, fed the same message by a fanout,
-- each handle it once) and the message's outbox id (with its occurrence for recurring rows).
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {inbox_index} ON {inbox} (received_at)

-- name: inbox_exists
SELECT to_regclass({inbox_literal}) IS NOT NULL

-- name: inbox_record
-- In the handler's transaction: a row back means the message is new (run the handler); none
-- means it was handled before (ack it, run nothing). A second consumer recording the same id
-- at the same instant waits for the first one's transaction, then gets no row if it committed.
INSERT INTO {inbox} (consumer, message_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING
RETURNING true

-- name: inbox_prune
-- One batch of rows older than $1 seconds ($2 at most), oldest first; run until it deletes none.
DELETE FROM {inbox}
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox}
    WHERE received_at < now() - make_interval(secs => $1)
    ORDER BY received_at
    LIMIT $2))

-- name: inbox_stats
-- Per consumer: messages recorded and the oldest and newest receipt.
SELECT consumer, count(*) AS messages, min(received_at) AS oldest, max(received_at) AS newest
FROM {inbox}
GROUP BY consumer
ORDER BY consumer

-- name: inbox_size
-- The table's size on disk, indexes included (bytes).
SELECT pg_total_relation_size({inbox_literal})
