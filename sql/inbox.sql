-- The consumer's inbox (relay/inbox/): every statement it runs, each under a `-- name:` header.
-- It lives in the consumer's own database, not the outbox's. {inbox} is the quoted table,
-- {inbox_index} the quoted name of its index on received_at, {inbox_literal} the table as a
-- string literal; {inbox_attempts} and {inbox_parked} its two companions (`<table>_attempts`,
-- `<table>_parked`), {inbox_attempts_literal} and {inbox_parked_literal} as literals. docs/inbox.md shows the same statements for consumers in other languages.

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
CREATE INDEX IF NOT EXISTS {inbox_index} ON {inbox} (received_at);
-- Deliveries of a message the broker delivered again (its `redelivered` flag), counted before
-- the handler runs, in a transaction of their own: a message that kills the consumer's process
-- (out of memory, a crash, os._exit) leaves its count here, where the consumer's memory would
-- lose it. Deleted with the inbox record when the handler commits, or when the message is
-- parked.
CREATE TABLE IF NOT EXISTS {inbox_attempts} (
    consumer   text        NOT NULL,
    message_id text        NOT NULL,
    attempts   integer     NOT NULL,
    last_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
-- Messages given up after max_attempts deliveries, whole, with the reason: kept here whether or
-- not the queue has a dead-letter exchange. A message parked here and delivered again is
-- rejected without running the handler.
CREATE TABLE IF NOT EXISTS {inbox_parked} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    reason      text        NOT NULL,
    attempts    integer     NOT NULL,
    exchange    text,
    routing_key text,
    headers     jsonb,
    body        bytea       NOT NULL,
    PRIMARY KEY (consumer, message_id)
)

-- name: inbox_exists
-- The inbox and its two companions (a table made by an older `relay inbox migrate` has none).
SELECT to_regclass({inbox_literal}) IS NOT NULL
       AND to_regclass({inbox_attempts_literal}) IS NOT NULL
       AND to_regclass({inbox_parked_literal}) IS NOT NULL

-- name: inbox_attempt
-- A delivery the broker made again ($1 consumer, $2 key): counted in a transaction of its own
-- before the handler runs; the first delivery is not written (it is the 1). This delivery's
-- number.
INSERT INTO {inbox_attempts} AS a (consumer, message_id, attempts) VALUES ($1, $2, 2)
ON CONFLICT (consumer, message_id)
DO UPDATE SET attempts = a.attempts + 1, last_at = now()
RETURNING attempts

-- name: inbox_attempts_done
-- In the handler's transaction (or the parking's): the message has its outcome.
DELETE FROM {inbox_attempts} WHERE consumer = $1 AND message_id = $2

-- name: inbox_handled
-- Whether the message's handler committed before ($1 consumer, $2 key).
SELECT EXISTS (SELECT 1 FROM {inbox} WHERE consumer = $1 AND message_id = $2)

-- name: inbox_is_parked
SELECT EXISTS (SELECT 1 FROM {inbox_parked} WHERE consumer = $1 AND message_id = $2)

-- name: inbox_park
-- Keep a message given up ($1 consumer, $2 key, $3 reason, $4 attempts, $5 exchange,
-- $6 routing key, $7 headers as JSON, $8 body); parked again, the latest reason wins.
INSERT INTO {inbox_parked} AS p
    (consumer, message_id, reason, attempts, exchange, routing_key, headers, body)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8)
ON CONFLICT (consumer, message_id)
DO UPDATE SET reason = EXCLUDED.reason, attempts = EXCLUDED.attempts, parked_at = now()

-- name: inbox_record
-- In the handler's transaction: a row back means the message is new (run the handler); none
-- means it was handled before (ack it, run nothing). A second consumer recording the same id
-- at the same instant waits for the first one's transaction, then gets no row if it committed.
INSERT INTO {inbox} (consumer, message_id) VALUES ($1, $2)
ON CONFLICT DO NOTHING
RETURNING true

-- name: inbox_prune
-- One batch of rows older than $1 seconds ($2 at most), oldest first; run until it deletes none.
-- Rows a consumer's transaction holds are skipped (a later prune takes them): the prune never
-- waits on a consumer.
DELETE FROM {inbox}
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox}
    WHERE received_at < now() - make_interval(secs => $1)
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED))

-- name: inbox_prune_attempts
-- Counts of deliveries older than $1 seconds: the message was handled or parked by a consumer
-- of another name, or left the queue another way (expired, purged).
DELETE FROM {inbox_attempts} WHERE last_at < now() - make_interval(secs => $1)

-- name: inbox_stats
-- Per consumer: messages recorded and the oldest and newest receipt.
SELECT consumer, count(*) AS messages, min(received_at) AS oldest, max(received_at) AS newest
FROM {inbox}
GROUP BY consumer
ORDER BY consumer

-- name: inbox_size
-- The table's size on disk, indexes included (bytes).
SELECT pg_total_relation_size({inbox_literal})
