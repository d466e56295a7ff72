-- Every SQL statement the relay runs, each under a `-- name:` header (see relay/queries.py).
-- {placeholders} are quoted identifiers of the configured outbox table and its companions.

-- ============================================================ migrations

-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtext('outbox-relay:migrate'))

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {migrations} (
    target     text NOT NULL,
    version    text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, version)
)

-- name: applied_migrations
SELECT version FROM {migrations} WHERE target = $1

-- name: record_migration
INSERT INTO {migrations} (target, version) VALUES ($1, $2)

-- name: install_trigger_always
-- One NOTIFY per statement with a constant payload: Postgres folds equal payloads within a
-- transaction, so a bulk insert wakes the relay once instead of once per row.
CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({channel_literal}, '');
    RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS {notify_trigger} ON {table};
CREATE TRIGGER {notify_trigger} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_fn}()

-- name: install_trigger_off
DROP TRIGGER IF EXISTS {notify_trigger} ON {table}

-- ============================================================ relay loop

-- name: claim_batch
-- Due unkeyed rows in insertion order; rows another relay holds are skipped, not waited for.
-- Keyed rows are claimed by claim_keyed (per-key order, docs/ordering.md).
SELECT id::text AS id, exchange, routing_key, content::text AS content,
       options::text AS options, attempts,
       EXTRACT(EPOCH FROM created_at)::float8 AS created_at_s, seq, NULL::text AS ordering_key
FROM {table}
WHERE available_at <= now() AND ordering_key IS NULL
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED

-- name: claim_keyed
-- The head runs of up to $2 keys, one relay per key at a time (sql/migrations/0004_ordering.sql).
SELECT id, exchange, routing_key, content, options, attempts, seq, ordering_key, created_at_s
FROM {claim_keyed_fn}($1, $2, $3)

-- name: claim_single_active
-- RELAY_MODE=single-active (one claimer, behind the fence): due rows in plain seq order, keyed
-- or not, except keyed rows behind an earlier row of their key that is not due (retrying or
-- delayed) or, with block ($2), whose key has a dead letter.
SELECT t.id::text AS id, t.exchange, t.routing_key, t.content::text AS content,
       t.options::text AS options, t.attempts, t.seq, t.ordering_key,
       EXTRACT(EPOCH FROM t.created_at)::float8 AS created_at_s
FROM {table} AS t
WHERE t.available_at <= now()
  AND (t.ordering_key IS NULL OR (
        NOT EXISTS (SELECT 1 FROM {table} AS e
                    WHERE hashtext(e.ordering_key) = hashtext(t.ordering_key)
                      AND e.ordering_key = t.ordering_key
                      AND e.seq < t.seq AND e.available_at > now())
        AND NOT ($2::boolean AND EXISTS (SELECT 1 FROM {dead} AS d
                                         WHERE d.ordering_key = t.ordering_key))))
ORDER BY t.seq
LIMIT $1
FOR UPDATE OF t SKIP LOCKED

-- name: single_active_fence
-- RELAY_MODE=single-active: batches of all relays on this table run one at a time, so a leader
-- that lost its lock cannot overlap its last batch with the next leader's first.
SELECT pg_advisory_xact_lock(hashtext('outbox-relay:fence:' || {table_literal}))

-- name: delete_published
DELETE FROM {table} WHERE id = ANY($1::uuid[])

-- name: archive_published
WITH moved AS (
    DELETE FROM {table} WHERE id = ANY($1::uuid[])
    RETURNING id, seq, exchange, routing_key, content, options, created_at, available_at,
              attempts, last_error, ordering_key
)
INSERT INTO {archive} (id, seq, exchange, routing_key, content, options, created_at,
                       available_at, attempts, last_error, ordering_key)
SELECT * FROM moved
ON CONFLICT (id) DO NOTHING

-- name: reschedule_failed
UPDATE {table} AS t
SET attempts = t.attempts + 1,
    last_error = f.error,
    available_at = now() + make_interval(secs => f.delay_s)
FROM unnest($1::uuid[], $2::text[], $3::float8[]) AS f(id, error, delay_s)
WHERE t.id = f.id

-- name: dead_letter
-- Moves rows to the dead-letter table with their reason, in the claim's transaction.
WITH reasons AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::boolean[]) AS f(id, reason, counted)
), moved AS (
    DELETE FROM {table} AS t USING reasons AS r WHERE t.id = r.id
    RETURNING t.id, t.seq, t.exchange, t.routing_key, t.content, t.options, t.created_at,
              t.available_at, t.attempts + CASE WHEN r.counted THEN 1 ELSE 0 END,
              r.reason AS last_error, t.ordering_key, r.reason
)
INSERT INTO {dead} (id, seq, exchange, routing_key, content, options, created_at,
                    available_at, attempts, last_error, ordering_key, reason)
SELECT * FROM moved
ON CONFLICT (id) DO UPDATE SET reason = EXCLUDED.reason, dead_at = now(),
    attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error

-- name: notify_dead
SELECT pg_notify({dead_channel_literal}, $1::text)

-- name: seconds_until_next_due
SELECT EXTRACT(EPOCH FROM (min(available_at) - now()))::float8
FROM {table}
WHERE available_at > now()

-- ============================================================ single-active leader

-- name: leader_try_lock
-- Session-level: held for as long as the leader's dedicated connection lives.
SELECT pg_try_advisory_lock(hashtext('outbox-relay:leader:' || {table_literal}))

-- ============================================================ status

-- name: backlog
SELECT count(*) FILTER (WHERE available_at <= now())                  AS due,
       count(*) FILTER (WHERE available_at > now())                   AS delayed,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)
                FILTER (WHERE available_at <= now())), 0)::float8      AS oldest_due_age_s,
       count(*) FILTER (WHERE attempts > 0)                           AS retrying
FROM {table}

-- name: relay_sessions
-- Relay processes connected to this database: each holds one LISTEN session (relay/listener.py
-- names it through application_name, see relay/outbox.py connect_args).
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'outbox-relay listener %'

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_health
SELECT n_live_tup, n_dead_tup,
       EXTRACT(EPOCH FROM now() - GREATEST(last_vacuum, last_autovacuum))::float8 AS vacuum_age_s
FROM pg_stat_user_tables
WHERE relid = {table_literal}::regclass

-- name: table_exists
SELECT to_regclass({table_literal}) IS NOT NULL

-- name: ping
SELECT 1
