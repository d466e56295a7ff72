-- Every SQL statement the relay runs, each under a `-- name:` header (see relay/pg/queries.py).
-- {placeholders} are quoted identifiers of the configured outbox table and its companions.

-- ============================================================ migrations

-- name: migration_session_lock
-- One `relay migrate` at a time, for the whole run, taken by polling, never by waiting in a
-- statement: a run that builds an index CONCURRENTLY waits for every transaction older than
-- the build, and a second run waiting for the lock inside a statement would be one (a
-- deadlock).
SELECT pg_try_advisory_lock(hashtext('outbox-relay:migrate'))

-- name: migration_session_unlock
SELECT pg_advisory_unlock(hashtext('outbox-relay:migrate'))

-- name: invalid_index
-- An index of this name in the outbox's schema left invalid by an interrupted CONCURRENTLY
-- build ($1: its name): dropped and built again.
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_index AS i ON i.indexrelid = c.oid
WHERE c.relname = $1 AND NOT i.indisvalid
  AND n.oid = (SELECT relnamespace FROM pg_class WHERE oid = {table_oid})

-- name: outbox_lock_holders
-- Sessions holding a lock on the outbox table (what keeps `relay migrate` waiting), oldest
-- transaction first; the query text is left out (it may hold data).
SELECT a.pid, a.usename, a.state,
       EXTRACT(EPOCH FROM now() - COALESCE(a.xact_start, a.backend_start))::float8 AS age_s
FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.granted AND l.relation = {table_oid} AND a.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY a.pid, a.usename, a.state, a.xact_start, a.backend_start
ORDER BY age_s DESC
LIMIT 5

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {migrations} (
    target     text NOT NULL,
    version    text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, version)
)

-- name: migrations_table_exists
SELECT to_regclass('{migrations}') IS NOT NULL

-- name: applied_migrations
-- By the table each record names, not its spelling: `queue_message` and
-- `public.queue_message` are one table with one schema history.
SELECT version FROM {migrations}
WHERE target = $1 OR to_regclass(target) = to_regclass($1)

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

-- name: stream_notify_off
-- The stream table's wake-up trigger (sql/migrations/0019) follows the outbox's mode: off
-- (producers using two-phase commit cannot NOTIFY) disables it; the others enable it.
ALTER TABLE {stream_table} DISABLE TRIGGER {stream_notify_trigger}

-- name: stream_notify_on
ALTER TABLE {stream_table} ENABLE TRIGGER {stream_notify_trigger}

-- name: install_trigger_conditional
-- Notifies only while some relay is asleep (or about to be), which it shows by holding, or
-- waiting for, the wake-up lock in exclusive mode (relay/pg/wakeup.py, docs/notify.md). When the
-- shared try-lock succeeds, no relay sleeps: the producer skips the NOTIFY (and its global
-- commit lock) and keeps the shared lock until it commits, so a relay about to sleep first
-- waits for this transaction to end and then sweeps once more, which finds its rows.
CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared({wakeup_lock_class}, TG_RELID::int) THEN
        PERFORM pg_notify({channel_literal}, '');
    END IF;
    RETURN NULL;
END
$fn$;
DROP TRIGGER IF EXISTS {notify_trigger} ON {table};
CREATE TRIGGER {notify_trigger} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_fn}()

-- name: mark_notify_mode
-- Records the installed mode on the trigger, where running relays read it (notify_mode).
COMMENT ON TRIGGER {notify_trigger} ON {table} IS 'outbox-relay notify mode: {notify_mode}'

-- name: announce_notify_mode
-- Sent by `relay migrate` with the trigger change: running relays wake up and re-read the mode.
SELECT pg_notify({channel_literal}, 'notify-mode')

-- name: notify_mode
-- The mode installed on the table: the trigger's comment; a trigger without one predates the
-- comment and notifies always; no trigger means polling only.
SELECT COALESCE(
    (SELECT COALESCE(substring(obj_description(t.oid, 'pg_trigger')
                               FROM 'notify mode: (\w+)'), 'always')
     FROM pg_trigger t
     WHERE t.tgrelid = {table_literal}::regclass AND t.tgname = '{name}_notify'),
    'off')

-- name: wakeup_prepare_sleep
-- One round trip before a relay sleeps: the installed mode and, in conditional mode, the
-- wake-up lock in exclusive mode. The lock waits for every producer that holds it shared
-- (it saw no relay asleep and did not notify); CASE evaluates the lock call only when needed.
SELECT m.mode,
       CASE WHEN m.mode = 'conditional'
            THEN pg_advisory_lock({wakeup_lock_class}, {table_literal}::regclass::oid::int)
                 IS NOT NULL
            ELSE false END AS locked
FROM (SELECT COALESCE(
          (SELECT COALESCE(substring(obj_description(t.oid, 'pg_trigger')
                                     FROM 'notify mode: (\w+)'), 'always')
           FROM pg_trigger t
           WHERE t.tgrelid = {table_literal}::regclass AND t.tgname = '{name}_notify'),
          'off') AS mode) AS m

-- name: wakeup_try_sleep
-- The same without queueing (after a drain that found rows, relay/pg/wakeup.py): locked is
-- false while any producer holds the lock shared.
SELECT m.mode,
       CASE WHEN m.mode = 'conditional'
            THEN pg_try_advisory_lock({wakeup_lock_class}, {table_literal}::regclass::oid::int)
            ELSE false END AS locked
FROM (SELECT COALESCE(
          (SELECT COALESCE(substring(obj_description(t.oid, 'pg_trigger')
                                     FROM 'notify mode: (\w+)'), 'always')
           FROM pg_trigger t
           WHERE t.tgrelid = {table_literal}::regclass AND t.tgname = '{name}_notify'),
          'off') AS mode) AS m

-- name: wakeup_check
-- Right after the wake-up lock is granted (a new statement: a snapshot that sees every
-- producer that skipped the NOTIFY): are rows due now (then the relay sweeps once more), and
-- in how many seconds does the next delayed row fall due (NULL: none)? Both walk the
-- available_at index from one end.
-- Epochs are subtracted, not timestamps: a producer may write available_at = 'infinity'
-- ("never"), and `infinity - now()` is an error before PostgreSQL 17 (the relay looped on it).
SELECT EXISTS (SELECT 1 FROM {table} WHERE available_at <= now()) AS due_now,
       (EXTRACT(EPOCH FROM (SELECT min(available_at) FROM {table} WHERE available_at > now()))
        - EXTRACT(EPOCH FROM now()))::float8 AS next_due_s

-- name: wakeup_release
SELECT pg_advisory_unlock({wakeup_lock_class}, {table_literal}::regclass::oid::int)

-- name: wakeup_role_try
-- The sleeper role (relay/pg/wakeup.py): one relay per table at a time, for the life of its
-- session. Key: the wake-up lock's class + 1 and the table oid.
SELECT pg_try_advisory_lock({wakeup_lock_class} + 1, {table_literal}::regclass::oid::int)

-- name: wakeup_role_wait
-- Waits until the sleeper's session ends, at most $1 milliseconds (lock_timeout, set for this
-- statement only: the FROM row is made before the lock call runs). A statement holds a snapshot
-- while it waits: one waiting an hour kept VACUUM from removing what the relays deleted since,
-- and every CREATE INDEX CONCURRENTLY in the database waiting for it; the waiter asks again
-- after each slice (relay/pg/election.py).
SELECT pg_advisory_lock({wakeup_lock_class} + 1, {table_literal}::regclass::oid::int)
       IS NOT NULL
FROM (SELECT set_config('lock_timeout', $1::text, true)) AS slice

-- name: wakeup_sleepers
-- Relays asleep on this table right now (holding the wake-up lock), for tests and operators.
-- Locks are server-wide and a database cloned from another has the same table oids: only this
-- database's count.
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND classid = {wakeup_lock_class}::oid
  AND objid = {table_literal}::regclass::oid AND objsubid = 2
  AND mode = 'ExclusiveLock' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())

-- ============================================================ relay loop

-- name: claim
-- One round trip for both kinds of due row, each locked FOR UPDATE SKIP LOCKED (rows another
-- relay holds are skipped, not waited for), at most $1 rows and about $4 bytes in all:
-- * keyed: the head runs of up to $2 keys, by {claim_keyed_fn} (per-key order, docs/ordering.md;
--   $3: skip keys that have a dead letter; sql/migrations/0013_keyed_claim_bounded.sql: its
--   cost is bounded whatever waits behind a key that cannot go);
-- * unkeyed, fair between transactions: first a share of due rows from each of the 32 newest
--   transactions that have rows, at most half the room, by {claim_fair_fn}
--   (sql/migrations/0011_fair_claims.sql); then the rest of the room in insertion order.
--   Bulk transactions' backlogs cannot hold back a row that a transaction just committed,
--   and the oldest rows always go.
--   $7 (NULL: none): the fair round takes transactions up to this one only (the newer ones are
--   the express lane's while it runs, relay/loop/express.py).
--   Then, in what is left of that half, a share from each of up to 32 producers' fairness keys,
--   in turn from the first key after $9 (NULL: the first), by {claim_keys_fn}
--   (sql/migrations/0012_fairness_key.sql); such rows come with their key in `fair_key`, so
--   that the next claim goes on after the last key served.
--   Both parts take rows from seq $5 up (deleted rows a pinned xmin horizon keeps in the index
--   stay below it, relay/pg/seqfloor.py; a sweep passes the lowest bigint); the fill in seq
--   order from $10 up ($10 >= $5: above the rows this relay's own claims took while a backlog
--   drains, so that it does not walk the rows other claims hold, relay/pg/seqfloor.py), and
--   when $11, above the table's shared frontier too (the highest seq any relay's full claim
--   filled up to, sql/migrations/0027_shared_fill_frontier.sql: read by a function, since a
--   scan of the sequence would be a Seq Scan these sessions price out, and in a sub-SELECT,
--   evaluated once, since the function is volatile and could not bound the index scan
--   otherwise). Rows of the fill come with `fill` true.
-- $6 true: keyed first, unkeyed in the room left; false: the other way round. Callers
-- alternate, so that a deep backlog of one kind cannot starve the other while a table holding
-- one kind only still gets full batches. A kind whose turn finds no room is not run.
-- The byte budget: the batch's first row always goes, then rows while the bytes so far
-- (content and options) are under it; unkeyed rows past it stay locked, untouched, until this
-- transaction ends. Content comes as UTF-8 bytes: the message body as it is, never a str.
-- $8: a row whose content is larger (RELAY_MAX_MESSAGE_BYTES) comes without it, its size in
-- `withheld`: the relay parks it (too_large) in this transaction, and its content never leaves
-- the server (a row of hundreds of MiB would take the relay past its memory limit, every
-- replica in turn). Such a row still counts against the byte budget: it ends its batch.
-- A recurring row (docs/recurring.md) comes with its `repeat` and the time it was due
-- (`occurrence_s`, epoch seconds); it has no ordering key (the table's CHECK), so the keyed
-- parts return neither.
-- $6 goes through a materialized CTE, so that the plan is the same whatever its value: the
-- server then keeps one generic plan instead of planning every claim again.
WITH turn AS MATERIALIZED (SELECT $6::boolean AS keyed_first),
keyed_first AS (
    SELECT f.id, f.exchange, f.routing_key, f.content, f.options, f.attempts, f.created_at_s,
           f.seq, f.ordering_key, NULL::text AS fair_key, NULL::text AS repeat,
           NULL::float8 AS occurrence_s, NULL::boolean AS fill
    FROM turn AS t, {claim_keyed_fn}(CASE WHEN t.keyed_first THEN $1::integer END, $2::integer,
                                    $3::boolean, $4::bigint) AS f
    WHERE t.keyed_first),
room_after_keyed AS (
    SELECT $1 - count(*) AS n_rows,
           $4 - COALESCE(sum(COALESCE(octet_length(content), 0)
                             + COALESCE(octet_length(options), 0)), 0) AS n_bytes
    FROM keyed_first),
fair AS (
    SELECT f AS seq
    FROM room_after_keyed AS r,
         {claim_fair_fn}(CASE WHEN r.n_bytes > 0 THEN r.n_rows::integer END, $5::bigint,
                         NULL, $7::text::xid8) AS f),
fair_by_key AS (
    -- Only while some unkeyed row has a fairness key (one look at an index that holds only
    -- such rows): the function costs a plan of its own at every call.
    SELECT k.seq, k.fairness_key
    FROM room_after_keyed AS r, (SELECT count(*) AS n FROM fair) AS x,
         {claim_keys_fn}(CASE WHEN r.n_bytes > 0 THEN (r.n_rows / 2 - x.n)::integer END,
                         GREATEST(r.n_rows / 64, 1)::integer, $5::bigint, $9::text) AS k
    WHERE EXISTS (SELECT 1 FROM {table} AS e
                  WHERE e.ordering_key IS NULL AND e.fairness_key IS NOT NULL)),
fair_seqs AS (
    SELECT COALESCE(array_agg(DISTINCT a.seq), '{}'::bigint[]) AS seqs,
           count(DISTINCT a.seq) AS n,
           COALESCE((SELECT array_agg(seq) FROM fair_by_key), '{}'::bigint[]) AS by_key
    FROM (SELECT seq FROM fair UNION ALL SELECT seq FROM fair_by_key) AS a),
unkeyed AS (
    SELECT w.id, w.exchange, w.routing_key, w.content, w.options, w.attempts, w.created_at_s,
           w.seq, w.ordering_key, w.fair_key, w.repeat, w.occurrence_s, w.fill
    FROM (SELECT c.*,
                 sum(COALESCE(octet_length(c.content), 0) + COALESCE(octet_length(c.options), 0))
                     OVER (ORDER BY c.fill, c.seq)
                     - COALESCE(octet_length(c.content), 0) - COALESCE(octet_length(c.options), 0)
                     AS before
          FROM (SELECT id::text AS id, exchange, routing_key,
                       convert_to(content::text, 'UTF8') AS content, options::text AS options,
                       GREATEST(attempts, 0) AS attempts,
                       EXTRACT(EPOCH FROM created_at)::float8 AS created_at_s, seq,
                       NULL::text AS ordering_key,
                       CASE WHEN seq = ANY((SELECT by_key FROM fair_seqs)::bigint[])
                            THEN fairness_key END AS fair_key,
                       repeat, CASE WHEN repeat IS NOT NULL
                            THEN EXTRACT(EPOCH FROM COALESCE(occurrence_at, available_at))::float8
                            END AS occurrence_s,
                       false AS fill
                FROM {table}
                WHERE seq = ANY((SELECT seqs FROM fair_seqs)::bigint[])
                UNION ALL
                SELECT * FROM (
                    SELECT id::text AS id, exchange, routing_key,
                           convert_to(content::text, 'UTF8') AS content,
                           options::text AS options, GREATEST(attempts, 0) AS attempts,
                           EXTRACT(EPOCH FROM created_at)::float8 AS created_at_s, seq,
                           NULL::text AS ordering_key, NULL::text AS fair_key,
                           repeat, CASE WHEN repeat IS NOT NULL
                                        THEN EXTRACT(EPOCH FROM COALESCE(occurrence_at,
                                                                         available_at))::float8
                                   END AS occurrence_s,
                           true AS fill
                    FROM {table}
                    WHERE available_at <= now() AND ordering_key IS NULL
                      AND seq >= GREATEST($10::bigint,
                                          CASE WHEN $11::boolean
                                               THEN (SELECT pg_sequence_last_value(
                                                         {fill_frontier_literal}) + 1) END)
                      AND seq <> ALL((SELECT seqs FROM fair_seqs)::bigint[])
                    ORDER BY seq
                    LIMIT (SELECT CASE WHEN r.n_bytes > 0 THEN GREATEST(r.n_rows - f.n, 0)
                                       ELSE 0 END
                           FROM room_after_keyed AS r, fair_seqs AS f)
                    FOR UPDATE SKIP LOCKED) AS filled) AS c) AS w
    WHERE w.before < (SELECT n_bytes FROM room_after_keyed)),
room_after_unkeyed AS (
    SELECT (SELECT n_rows FROM room_after_keyed) - count(*) AS n_rows,
           (SELECT n_bytes FROM room_after_keyed)
               - COALESCE(sum(COALESCE(octet_length(content), 0)
                              + COALESCE(octet_length(options), 0)), 0) AS n_bytes
    FROM unkeyed),
keyed_after AS (
    SELECT f.id, f.exchange, f.routing_key, f.content, f.options, f.attempts, f.created_at_s,
           f.seq, f.ordering_key, NULL::text AS fair_key, NULL::text AS repeat,
           NULL::float8 AS occurrence_s, NULL::boolean AS fill
    FROM turn AS t, room_after_unkeyed AS r,
         {claim_keyed_fn}(CASE WHEN NOT t.keyed_first THEN r.n_rows::integer END, $2::integer,
                          $3::boolean, r.n_bytes::bigint) AS f
    WHERE NOT t.keyed_first AND r.n_rows > 0 AND r.n_bytes > 0)
SELECT c.id, c.exchange, c.routing_key,
       CASE WHEN octet_length(c.content) <= $8 THEN c.content END AS content,
       c.options, c.attempts, c.created_at_s, c.seq, c.ordering_key,
       CASE WHEN octet_length(c.content) > $8 THEN octet_length(c.content) END AS withheld,
       c.fair_key, c.repeat, c.occurrence_s, c.fill
FROM (SELECT * FROM keyed_first
      UNION ALL
      SELECT * FROM unkeyed
      UNION ALL
      SELECT * FROM keyed_after) AS c

-- name: fill_frontier_move
-- After a claim: $2 (it came back full), every relay's next fills start above $1, the highest
-- seq its fill took; not full (no backlog above where it started, or rows given back below the
-- frontier), they start at their floors again. A write only when the value changes. Not atomic
-- with other relays' moves: two at once may keep the lower value, which costs a later claim
-- some locked rows to step over and nothing else; the fair round and the floor's rescans find
-- whatever lies below (relay/pg/seqfloor.py). $1 the lowest bigint and $2 true: nothing.
-- The sequence is read by a function, not scanned: a scan would be a Seq Scan, which the
-- claiming sessions' plans price out (relay/pg/connection.py).
SELECT CASE WHEN $2::boolean
            THEN CASE WHEN COALESCE(pg_sequence_last_value({fill_frontier_literal}),
                                    -9223372036854775808) < $1::bigint
                      THEN setval({fill_frontier_literal}, $1::bigint) END
            ELSE CASE WHEN COALESCE(pg_sequence_last_value({fill_frontier_literal}),
                                    -9223372036854775808) > -9223372036854775808
                      THEN setval({fill_frontier_literal}, -9223372036854775808) END
       END

-- name: claim_express
-- The express lane (relay/loop/express.py): the fair round of `claim` alone, for rows that
-- newer transactions committed while a backlog drains: a share from each of the newest
-- transactions newer than $4 (the newest when the drain began), at most $1 rows, about $2
-- bytes (the first row always goes), from seq $3 up; content over $5 bytes withheld (claim).
SELECT w.id, w.exchange, w.routing_key,
       CASE WHEN octet_length(w.content) <= $5 THEN w.content END AS content,
       w.options, w.attempts, w.created_at_s, w.seq, w.ordering_key,
       CASE WHEN octet_length(w.content) > $5 THEN octet_length(w.content) END AS withheld,
       w.repeat, w.occurrence_s
FROM (SELECT c.*,
             sum(COALESCE(octet_length(c.content), 0) + COALESCE(octet_length(c.options), 0))
                 OVER (ORDER BY c.seq)
                 - COALESCE(octet_length(c.content), 0) - COALESCE(octet_length(c.options), 0)
                 AS before
      FROM (SELECT id::text AS id, exchange, routing_key,
                   convert_to(content::text, 'UTF8') AS content, options::text AS options,
                   GREATEST(attempts, 0) AS attempts,
                   EXTRACT(EPOCH FROM created_at)::float8 AS created_at_s, seq,
                   NULL::text AS ordering_key, repeat, CASE WHEN repeat IS NOT NULL
                            THEN EXTRACT(EPOCH FROM COALESCE(occurrence_at, available_at))::float8
                            END AS occurrence_s
            FROM {table}
            WHERE seq = ANY(ARRAY(SELECT f FROM {claim_fair_fn}($1::integer, $3::bigint,
                                                               $4::text::xid8) AS f))
           ) AS c) AS w
WHERE w.before < $2

-- name: newest_transaction
-- The express lane's look between claims: the newest transaction newer than $1 (the newest
-- the lane saw before) that has unkeyed rows, as text (NULL: none): a new one means rows to
-- claim. $1 bounds the scan of the (xact, seq) index from its end: the entries of rows the
-- lane already claimed and deleted stay in the index while a transaction elsewhere pins the
-- xmin horizon, and without the bound each look walked all of them. Beside it, the oldest
-- transaction still running (every older one has ended): how far the lane's claims may move
-- their own bound (relay/loop/express.py). A plain statement: it runs every few milliseconds while a backlog drains, and a function with
-- a plan of its own cost the server 2-3x its CPU (96 us a look here). Its plan is made during
-- a drain, and an ANALYZE at the backlog's start (relay/pg/tablestats.py) makes it again if
-- the statistics said the table was empty.
SELECT (SELECT max(xact) FROM {table} WHERE ordering_key IS NULL AND xact > $1::text::xid8)::text,
       pg_snapshot_xmin(pg_current_snapshot())::text

-- name: claim_single_active
-- RELAY_MODE=single-active (one claimer, behind the fence): due rows in plain seq order, keyed
-- or not, except keyed rows behind an earlier row of their key that is not due (retrying or
-- delayed) or, with block ($2), whose key has a dead letter. Bounded by bytes ($3) as claim
-- is; content over $4 bytes withheld as in claim.
-- Its cost does not grow with rows it cannot take: it looks at two windows of $6 rows each,
-- the table's first rows (a) and, when those give less than a batch, the rows after
-- max(a's end, $5) (b; $5 is the caller's cursor, relay/pg/store.py SingleActiveWalk, which
-- moves on over rows that cannot go, a blocked key's stretch, one window per claim). A keyed
-- row of b goes only when no row of its key lies between the two windows and every row of its
-- key in a can go: each key keeps its order. Rows the cursor passed over that can go later (a
-- retried head, a delayed row come due) wait for it to come round. A last row with a NULL id
-- says what the walk saw: a_full (a held $6 rows), walked (b was looked at), b_rows, b_end.
WITH a AS MATERIALIZED (
    SELECT t.seq, t.ordering_key,
           t.available_at <= now()
               AND NOT (t.ordering_key IS NOT NULL AND $2::boolean
                        AND EXISTS (SELECT 1 FROM {dead} AS d
                                    WHERE d.ordering_key = t.ordering_key)) AS can
    FROM {table} AS t
    ORDER BY t.seq
    LIMIT $6),
a_end AS (SELECT max(seq) AS s, count(*) AS n FROM a),
a_rows AS MATERIALIZED (
    SELECT a.seq, a.ordering_key,
           CASE WHEN a.ordering_key IS NULL THEN a.can
                ELSE bool_and(a.can) OVER (PARTITION BY a.ordering_key ORDER BY a.seq) END AS ok
    FROM a),
walk_b AS (
    SELECT e.n >= $6 AND (SELECT count(*) FROM a_rows WHERE ok) < $1 AS yes,
           GREATEST(e.s, $5::bigint) AS after
    FROM a_end AS e),
b AS MATERIALIZED (
    SELECT t.seq, t.ordering_key,
           t.available_at <= now()
               AND NOT (t.ordering_key IS NOT NULL AND (
                   ($2::boolean AND EXISTS (SELECT 1 FROM {dead} AS d
                                            WHERE d.ordering_key = t.ordering_key))
                   OR t.ordering_key IN (SELECT r.ordering_key FROM a_rows AS r
                                         WHERE NOT r.ok AND r.ordering_key IS NOT NULL)
                   -- the key's first row after the first window (one probe of the key's
                   -- index, never a walk of the rows between the windows)
                   OR (SELECT g.seq FROM {table} AS g
                       WHERE hashtext(g.ordering_key) = hashtext(t.ordering_key)
                         AND g.ordering_key = t.ordering_key
                         AND g.seq > (SELECT s FROM a_end)
                       ORDER BY hashtext(g.ordering_key), g.ordering_key, g.seq
                       LIMIT 1) <= (SELECT after FROM walk_b))) AS can
    FROM {table} AS t
    WHERE (SELECT yes FROM walk_b) AND t.seq > (SELECT after FROM walk_b)
    ORDER BY t.seq
    LIMIT $6),
b_rows AS (
    SELECT b.seq,
           CASE WHEN b.ordering_key IS NULL THEN b.can
                ELSE bool_and(b.can) OVER (PARTITION BY b.ordering_key ORDER BY b.seq) END AS ok
    FROM b),
cand AS (
    SELECT u.seq FROM (SELECT seq, ok FROM a_rows UNION ALL SELECT seq, ok FROM b_rows) AS u
    WHERE u.ok
    ORDER BY u.seq
    LIMIT $1)
SELECT id, exchange, routing_key,
       CASE WHEN octet_length(content) <= $4 THEN content END AS content,
       options, attempts, seq, ordering_key, created_at_s,
       CASE WHEN octet_length(content) > $4 THEN octet_length(content) END AS withheld,
       repeat, occurrence_s,
       NULL::boolean AS a_full, NULL::boolean AS walked, NULL::bigint AS b_rows,
       NULL::bigint AS b_end
FROM (SELECT c.*,
             sum(COALESCE(octet_length(c.content), 0) + COALESCE(octet_length(c.options), 0))
                 OVER (ORDER BY c.seq)
                 - COALESCE(octet_length(c.content), 0) - COALESCE(octet_length(c.options), 0)
                 AS before
      FROM (SELECT t.id::text AS id, t.exchange, t.routing_key,
                   convert_to(t.content::text, 'UTF8') AS content,
                   t.options::text AS options, GREATEST(t.attempts, 0) AS attempts, t.seq,
                   t.ordering_key, EXTRACT(EPOCH FROM t.created_at)::float8 AS created_at_s,
                   t.repeat, CASE WHEN t.repeat IS NOT NULL
                        THEN EXTRACT(EPOCH FROM COALESCE(t.occurrence_at, t.available_at))::float8
                        END AS occurrence_s
            FROM {table} AS t
            WHERE t.seq = ANY(ARRAY(SELECT seq FROM cand))
            ORDER BY t.seq
            FOR UPDATE OF t SKIP LOCKED) AS c) AS w
WHERE w.before < $3
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT n >= $6 FROM a_end), (SELECT yes FROM walk_b), (SELECT count(*) FROM b),
       (SELECT max(seq) FROM b)
ORDER BY seq NULLS LAST

-- name: single_active_fence
-- RELAY_MODE=single-active: batches of all relays on this table run one at a time, so a leader
-- that lost its lock cannot overlap its last batch with the next leader's first.
SELECT pg_advisory_xact_lock({fence_lock_class}, {table_oid})

-- name: delete_published
DELETE FROM {table} WHERE id = ANY($1::uuid[])

-- name: delete_published_and_commit
-- The end of a batch whose rows were all published: their DELETE and the COMMIT in one round
-- trip. A script without parameters: the ids placeholder becomes the rows' ids, each parsed
-- as a uuid and written back canonically (relay/pg/store.py), so no other text can reach it.
DELETE FROM {table} WHERE id = ANY('{ids}'::uuid[]);
COMMIT

-- name: archive_published
WITH moved AS (
    DELETE FROM {table} WHERE id = ANY($1::uuid[])
    RETURNING id, seq, exchange, routing_key, content, options, created_at, available_at,
              attempts, last_error, ordering_key
)
INSERT INTO {archive} (id, seq, exchange, routing_key, content, options, created_at,
                       available_at, attempts, last_error, ordering_key)
SELECT * FROM moved
ON CONFLICT DO NOTHING

-- name: reschedule_repeating
-- Published recurring rows stay: each is due again at its next time ($2: the cron rows' times,
-- computed by relay/schedule.py; NULL for an interval, counted from now here), attempts reset.
-- $3 (archiving): each occurrence is archived first, under an id of its own (the row's id and
-- the time it was due, hashed), its seq the row's, so `WHERE seq = ...` finds every occurrence
-- of a row in the archive.
WITH occurrences AS (
    INSERT INTO {archive} (id, seq, exchange, routing_key, content, options, created_at,
                           available_at, attempts, last_error, ordering_key)
    SELECT md5(t.id::text || '@'
               || EXTRACT(EPOCH FROM COALESCE(t.occurrence_at, t.available_at))::text)::uuid,
           t.seq,
           t.exchange, t.routing_key, t.content, t.options, t.created_at, t.available_at,
           t.attempts, t.last_error, t.ordering_key
    FROM {table} AS t
    WHERE $3::boolean AND t.id = ANY($1::uuid[]) AND t.repeat IS NOT NULL
    ON CONFLICT DO NOTHING
)
UPDATE {table} AS t
-- (an interval as the table's CHECK reads it: upper case, blanks trimmed)
SET available_at = COALESCE(f.next_at, now() + upper(btrim(t.repeat, E' \t'))::interval),
    attempts = 0, last_error = NULL, occurrence_at = NULL
FROM unnest($1::uuid[], $2::timestamptz[]) AS f(id, next_at)
WHERE t.id = f.id AND t.repeat IS NOT NULL

-- name: database_time
-- When a recurring row's next cron time is computed from: the server's clock at the settle.
SELECT clock_timestamp()

-- name: reschedule_failed
-- $4: whether the row's attempt counts (false: its destination stopped confirming, which is
-- not the row's fault; it is only due again later).
UPDATE {table} AS t
-- attempts is a producer-writable integer: a negative count reads as 0 and the count stops
-- at integer's maximum (2147483647 + 1 overflowed and rolled back the whole settle).
SET attempts = CASE WHEN f.counted THEN LEAST(GREATEST(t.attempts, 0), 2147483646) + 1
                    ELSE t.attempts END,
    last_error = f.error,
    available_at = now() + make_interval(secs => f.delay_s),
    -- a recurring row keeps the occurrence it is retrying (sql/migrations/0023)
    occurrence_at = CASE WHEN t.repeat IS NOT NULL
                         THEN COALESCE(t.occurrence_at, t.available_at) END
FROM unnest($1::uuid[], $2::text[], $3::float8[], $4::boolean[]) AS f(id, error, delay_s, counted)
WHERE t.id = f.id

-- name: dead_letter
-- Moves rows to the dead-letter table with their reason, in the claim's transaction, through
-- the definer function of sql/migrations/0014 (the relay role has no INSERT there; the
-- function also raises a WARNING into the server's log). Each parked row is a dead letter of
-- its own, also when its id was parked before. The dead-letter channel hears one notification
-- per statement, at commit: the table, how many rows, the first one's id and reason (at most
-- 500 characters), as JSON (nothing when none parked: the statement is also run empty,
-- before any transaction, to prepare it; relay/pg/store.py).
SELECT p.n, CASE WHEN p.n > 0 THEN pg_notify(
                {dead_channel_literal},
                json_build_object('table', {table_name_literal}, 'count', p.n,
                                  'id', ($1::uuid[])[1], 'reason',
                                  left(($2::text[])[1], 500))::text) END
FROM (SELECT {dead_letter_fn}($1::uuid[], $2::text[], $3::boolean[]) AS n) AS p

-- name: seconds_until_next_due
-- By epochs, as wakeup_check: an available_at of 'infinity' reads as Infinity, not an error.
SELECT (EXTRACT(EPOCH FROM min(available_at)) - EXTRACT(EPOCH FROM now()))::float8
FROM {table}
WHERE available_at > now()

-- ============================================================ single-active leader

-- name: leader_try_lock
-- Session-level: held for as long as the leader's dedicated connection lives. Keyed on the
-- table's oid, so every spelling of RELAY_TABLE that names this table competes for one lock.
SELECT pg_try_advisory_lock({leader_lock_class}, {table_oid})

-- ============================================================ status

-- name: refresh_statistics
-- When a backlog begins (relay/pg/tablestats.py): the table analyzed if its statistics count
-- fewer rows than $1 (true), not (false), or not now (NULL: its ANALYZE or VACUUM lock is
-- held), by {analyze_fn} (sql/migrations/0025_statistics_refresh.sql).
SELECT {analyze_fn}($1::bigint)

-- name: whole_table_plans
-- In a transaction of a session that plans by the indexes (relay/pg/connection.py
-- PLANS_BY_INDEX), before statements that read the whole table (the backlog's figures).
SET LOCAL enable_seqscan = on; SET LOCAL enable_bitmapscan = on

-- name: backlog
-- The due rows' age also by class (docs/fairness.md): rows of transactions that wrote fewer
-- than 1,000 rows ("live": applications) and of those that wrote more ("bulk": backfills,
-- Spark), so that an alert on live lag does not fire for a backfill, and the reverse.
-- created_at may be +-infinity (producers write it): an age is clamped to 0..100 years. A
-- recurring row's age counts from the time its occurrence was due, not from its INSERT.
WITH by_xact AS (
    SELECT count(*) AS n_rows,
           count(*) FILTER (WHERE available_at <= now()) AS due,
           count(*) FILTER (WHERE available_at > now()) AS delayed,
           count(*) FILTER (WHERE attempts > 0) AS retrying,
           count(*) FILTER (WHERE repeat IS NOT NULL) AS recurring,
           min(CASE WHEN repeat IS NULL THEN created_at
                    ELSE COALESCE(occurrence_at, available_at) END)
               FILTER (WHERE available_at <= now()) AS oldest_due
    FROM {table}
    GROUP BY xact)
SELECT COALESCE(sum(due), 0)::bigint AS due,
       COALESCE(sum(delayed), 0)::bigint AS delayed,
       LEAST(GREATEST(COALESCE(EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM min(oldest_due)),
                               0), 0), 3155760000)::float8 AS oldest_due_age_s,
       LEAST(GREATEST(COALESCE(EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM min(oldest_due)
                      FILTER (WHERE n_rows < 1000)), 0), 0), 3155760000)::float8
                                                          AS oldest_live_due_age_s,
       LEAST(GREATEST(COALESCE(EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM min(oldest_due)
                      FILTER (WHERE n_rows >= 1000)), 0), 0), 3155760000)::float8
                                                          AS oldest_bulk_due_age_s,
       COALESCE(sum(retrying), 0)::bigint AS retrying,
       COALESCE(sum(recurring), 0)::bigint AS recurring
FROM by_xact

-- name: relay_sessions
-- Relay processes connected to this database: each holds one LISTEN session (relay/pg/listener.py
-- names it through application_name, see relay/pg/connection.py connect_args).
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'outbox-relay listener %'

-- name: lock_strangers
-- Sessions that hold one of this table's relay roles without being a relay: the single-active
-- leader lock (leader_try_lock) or the wake-up sleeper role (wakeup_role_try). Advisory locks
-- need no privilege, so any login on the database can take them; a relay names its sessions
-- 'outbox-relay <role> <host> <pid>' (relay/pg/connection.py), and a holder named otherwise is
-- reported (the name is the client's own: this detects mistakes and squatters that do not
-- pretend, it does not authenticate).
SELECT CASE WHEN l.classid = {leader_lock_class}::oid THEN 'leader' ELSE 'wakeup' END AS role,
       l.pid, a.application_name
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.objid = {table_literal}::regclass::oid
  AND l.classid IN ({leader_lock_class}::oid, ({wakeup_lock_class} + 1)::oid)
  AND a.application_name NOT LIKE 'outbox-relay %'
ORDER BY 1, 2

-- name: dead_count
SELECT count(*) FROM {dead}

-- name: table_health
SELECT n_live_tup, n_dead_tup,
       EXTRACT(EPOCH FROM now() - GREATEST(last_vacuum, last_autovacuum))::float8 AS vacuum_age_s
FROM pg_stat_user_tables
WHERE relid = {table_literal}::regclass

-- name: table_traffic
-- Rows ever inserted into and removed from the outbox (statistics counters, flushed by the
-- server about once a second): two samples give the in and out rates of `relay status --watch`.
SELECT COALESCE(n_tup_ins, 0)::bigint AS inserted_total, COALESCE(n_tup_del, 0)::bigint AS removed_total
FROM pg_stat_user_tables
WHERE relid = {table_literal}::regclass

-- name: dead_by_reason
-- Dead letters grouped by the reason's code (its text before the first ':'), largest first.
SELECT split_part(reason, ':', 1) AS reason, count(*) AS n
FROM {dead}
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT 20

-- name: table_exists
SELECT to_regclass({table_literal}) IS NOT NULL

-- name: ping
SELECT 1

-- name: session_transaction_timeout
-- PostgreSQL 17+ (relay/pg/connection.py asks only those): a bound on a worker session's whole
-- transaction, for the session's life.
SELECT set_config('transaction_timeout', $1, false)

-- name: session_read_only
-- A session the relay keeps must be able to write: a standby (or a server set read-only) is
-- dropped and the connection retried, so that after a failover every session finds the primary.
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean

-- ============================================================ dead letters and retention
-- (relay/pg/deadletters.py: `relay dead ...` and `relay prune`)

-- name: dead_list
-- Dead letters, oldest first ($1: a reason code or NULL, $2: at most). A reason filter, here
-- and in every statement below, is the reason's code (its text before the first ':'), exact:
-- `internal` never takes a letter whose text mentions an exchange named `billing-internal`.
SELECT id::text AS id, dead_at, attempts, exchange, routing_key, reason
FROM {dead}
WHERE ($1::text IS NULL OR lower(split_part(reason, ':', 1)) = lower($1))
ORDER BY dead_at, dead_id
LIMIT $2

-- name: dead_count_matching
-- How many dead letters a filter matches ($1 ids or NULL, $2 reason code or NULL, $3 minimum
-- age in seconds or NULL): the "N of M" of listings and the total of long operations.
SELECT count(*) FROM {dead}
WHERE ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
  AND ($2::text IS NULL OR lower(split_part(reason, ':', 1)) = lower($2))
  AND ($3::float8 IS NULL OR dead_at < now() - make_interval(secs => $3))

-- name: dead_since
-- `relay dead watch --since`, as it begins: dead letters after ($1 dead_at, $2 dead_id), oldest
-- first, at most $3 (also those parked before dead_xact was recorded, sql/migrations/0028).
SELECT dead_id, id::text AS id, dead_at, attempts, exchange, routing_key, ordering_key, reason
FROM {dead}
WHERE dead_at >= $1 AND (dead_at, dead_id) > ($1, $2)
ORDER BY dead_at, dead_id
LIMIT $3

-- name: dead_watch_snapshot
-- `relay dead watch` (relay/pg/deadwatch.py), first in its REPEATABLE READ look: the bounds of
-- the snapshot the look reads, transaction ids as numbers: the first not yet given out, and
-- those still running (every letter of any other transaction below xmax is in the snapshot).
SELECT pg_snapshot_xmax(s)::text::bigint AS xmax,
       ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) AS x) AS xip
FROM pg_current_snapshot() AS s

-- name: dead_of_transactions
-- `relay dead watch`: the letters parked by the transactions $1 (ids as numbers; those that
-- were running at the last look), in the order of their transactions.
SELECT dead_id, dead_xact::text::bigint AS dead_xact, id::text AS id, dead_at, attempts,
       exchange, routing_key, ordering_key, reason
FROM {dead} AS d
WHERE d.dead_xact = ANY (ARRAY(SELECT x::text::xid8 FROM unnest($1::bigint[]) AS x))
ORDER BY d.dead_xact, d.dead_id

-- name: dead_from_transaction
-- `relay dead watch`: letters after ($1 transaction id as a number, $2 dead_id) in the order
-- of their transactions, at most $3: those parked since the last look's snapshot.
SELECT dead_id, dead_xact::text::bigint AS dead_xact, id::text AS id, dead_at, attempts,
       exchange, routing_key, ordering_key, reason
FROM {dead} AS d
WHERE (d.dead_xact, d.dead_id) > ($1::bigint::text::xid8, $2::bigint)
ORDER BY d.dead_xact, d.dead_id  -- the column (the output's dead_xact is a number), by its index
LIMIT $3

-- name: dead_show
-- Every column of each dead letter of id $1, the latest first; its content cut to $2 characters
-- (NULL: whole), with the size of the whole (a parked too_large row may be hundreds of MiB).
SELECT id::text AS id, seq, exchange, routing_key,
       CASE WHEN $2::int IS NULL THEN content::text ELSE left(content::text, $2::int) END
           AS content,
       octet_length(content::text) AS content_bytes,
       $2::int IS NOT NULL AND length(content::text) > $2::int AS content_cut,
       options::text AS options, ordering_key, created_at, available_at, attempts,
       last_error, reason, dead_at
FROM {dead}
WHERE id = $1::uuid
ORDER BY dead_id DESC

-- name: dead_snapshot
-- The ids an operation will touch, fixed when it starts (same filters as dead_count_matching,
-- $4 = at most this many, NULL = all): a replayed row that dies again at once is not replayed
-- a second time by the same command, so `replay --all` always ends.
-- One entry per id (an id parked twice has two dead letters; replay moves the latest).
SELECT id::text FROM {dead}
WHERE ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
  AND ($2::text IS NULL OR lower(split_part(reason, ':', 1)) = lower($2))
  AND ($3::float8 IS NULL OR dead_at < now() - make_interval(secs => $3))
GROUP BY id
ORDER BY min(dead_at), min(dead_id)
LIMIT $4

-- name: dead_replay
-- Moves the given dead letters back into the outbox through {replay_fn}
-- (sql/migrations/0006_replay_function.sql): the relay role has no INSERT on the outbox.
SELECT {replay_fn}($1::uuid[])

-- name: dead_unreplayable
-- Dead letters among $1 that replay left where they are, with why ($2: the ids it moved).
SELECT d.id::text AS id,
       CASE WHEN d.id = ANY($2::uuid[])
                THEN 'an older dead letter of this id (parked ' || d.dead_at::text
                     || '): the latest one was replayed'
            WHEN d.content IS NULL THEN 'content is NULL'
            WHEN d.exchange IS NULL THEN 'exchange is NULL'
            ELSE 'id already in the outbox' END AS why
FROM {dead} AS d
WHERE d.id = ANY($1::uuid[])
ORDER BY d.dead_id

-- name: dead_snapshot_keys
-- The dead letters a purge will delete, by their own key (dead_id), fixed when it starts: an
-- id parked again under another reason keeps its other dead letters. Filters as
-- dead_snapshot.
SELECT dead_id FROM {dead}
WHERE ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
  AND ($2::text IS NULL OR lower(split_part(reason, ':', 1)) = lower($2))
  AND ($3::float8 IS NULL OR dead_at < now() - make_interval(secs => $3))
ORDER BY dead_at, dead_id
LIMIT $4

-- name: dead_purge
-- Deletes the given dead letters (a slice of dead_snapshot_keys).
DELETE FROM {dead} WHERE dead_id = ANY($1::bigint[])

-- name: archive_prune
-- An archive that is not partitioned: bounded batches keep each transaction (and the WAL and
-- locks it holds) small.
DELETE FROM {archive}
WHERE id IN (SELECT id FROM {archive}
             WHERE published_at < now() - make_interval(secs => $1)
             ORDER BY published_at
             LIMIT $2)

-- name: archive_prune_default
-- A partitioned archive: its DEFAULT partition's old rows (those of days that had no partition
-- yet), in bounded batches as archive_prune.
DELETE FROM {archive_default}
WHERE ctid = ANY(ARRAY(SELECT ctid FROM {archive_default}
                       WHERE published_at < now() - make_interval(secs => $1)
                       ORDER BY published_at
                       LIMIT $2))

-- name: archive_drop_partitions
-- A partitioned archive: the partitions whose rows were all published more than $1 seconds ago
-- (sql/migrations/0016), dropped whole; their names, oldest first. Nothing on an archive that is
-- not partitioned.
SELECT p FROM {archive_drop_fn}(now() - make_interval(secs => $1)) AS p

-- name: archive_partitions_ahead
-- The archive's daily partitions from today through $1 days ahead, those missing (0016).
SELECT {archive_partitions_fn}($1::integer)

-- name: archive_is_partitioned
SELECT relkind = 'p' FROM pg_class WHERE oid = {archive_literal}::regclass

-- name: archive_partition_list
-- `relay status`: the archive's partitions, oldest first: name, bounds, size, rows (the
-- planner's estimate: counting would read them all).
SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bounds,
       pg_total_relation_size(c.oid) AS bytes, GREATEST(c.reltuples, 0)::bigint AS rows
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = {archive_literal}::regclass
ORDER BY c.relname = {archive_name_literal} || '_default', c.relname

-- name: archive_legacy_bound
-- Where the legacy partition ends: the start of the day after tomorrow (UTC). The CHECK of
-- archive_bound_add holds new rows to it from the conversion's first step on, so it leaves a
-- day at least before an archiving relay could publish a row past it.
SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '2 days'

-- name: archive_bound_setting
-- The bound for the conversion's statements, in the converting session only.
SELECT set_config('relay.archive_bound', $1::timestamptz::text, false)

-- name: archive_key_build
-- The conversion's first step (relay/pg/archive_convert.py): the legacy partition's part of
-- the new key, built beside the archive's traffic (archive INSERTs go on meanwhile).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {archive_key_ready} ON {archive} (id, published_at)

-- name: archive_bound_add
-- Every row published before the bound, added NOT VALID (no scan; a moment of ACCESS
-- EXCLUSIVE, under the caller's lock_timeout), replacing one an interrupted run left.
DO $$
BEGIN
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I, ADD CONSTRAINT %I CHECK '
                   '(id IS NOT NULL AND published_at IS NOT NULL AND published_at < %L) '
                   'NOT VALID', {archive_literal}, {archive_bound_literal},
                   {archive_bound_literal}, current_setting('relay.archive_bound'));
END $$

-- name: archive_bound_validate
-- The scan that ATTACH would make under ACCESS EXCLUSIVE, made under SHARE UPDATE EXCLUSIVE:
-- reads and archive INSERTs go on.
ALTER TABLE {archive} VALIDATE CONSTRAINT {archive_bound}

-- name: archive_bound_drop
ALTER TABLE {archive} DROP CONSTRAINT IF EXISTS {archive_bound}

-- name: archive_bound_left
-- A conversion's CHECK still on an archive that is not partitioned (the run was stopped).
SELECT EXISTS (SELECT 1 FROM pg_constraint
               WHERE conrelid = {archive_literal}::regclass AND conname = {archive_bound_literal})
       AND (SELECT relkind FROM pg_class WHERE oid = {archive_literal}::regclass) <> 'p'

-- name: archive_partition
-- `relay migrate --partition-archive` (docs/operations.md, "Retention"), its last step, in one
-- transaction under ACCESS EXCLUSIVE: the archive becomes range-partitioned on published_at,
-- one partition per UTC day. The archive as it was is kept, rows, indexes and grants, as the
-- first partition `<table>_archive_legacy`, for everything published before the bound
-- (archive_legacy_bound); retention drops it whole once its newest row is older than the age
-- given. A DEFAULT partition catches rows of a day without a partition. The key becomes (id,
-- published_at): the unique index built beforehand becomes the legacy partition's part of it,
-- and ATTACH reads no row (the validated CHECK proves they fit). So the lock is held a moment,
-- whatever the archive's size. Does nothing on an archive that is already partitioned.
DO $$
DECLARE
    rel regclass := {archive_literal}::regclass;
    nsp text := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = {archive_literal}::regclass);
    parent text := {archive_name_literal};
    legacy text := {archive_name_literal} || '_legacy';
    bound timestamptz := current_setting('relay.archive_bound')::timestamptz;
    g record;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = rel) = 'p' THEN
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE %s RENAME TO %I', rel, legacy);
    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS) '
                   'PARTITION BY RANGE (published_at)', nsp, parent, nsp, legacy);
    EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I PRIMARY KEY (id, published_at)',
                   nsp, parent, parent || '_key');
    EXECUTE format('CREATE INDEX %I ON %I.%I (published_at)', parent || '_published_idx', nsp,
                   parent);
    -- The old key on id alone goes: the key built beforehand replaces it (no scan: its
    -- columns are NOT NULL).
    EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', nsp, legacy, parent || '_pkey');
    EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I',
                   nsp, legacy, legacy || '_key', parent || '_key_ready');
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (MINVALUE) TO (%L)',
                   nsp, parent, nsp, legacy, bound);
    -- The partition's bound says what the CHECK said.
    EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', nsp, legacy, parent || '_bound');
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I DEFAULT', nsp, parent || '_default',
                   nsp, parent);
    -- The grants the archive had (the relay's, the Spark writer's), table and columns; the
    -- table's also on the DEFAULT partition, whose old rows `relay prune` deletes directly.
    FOR g IN SELECT a.privilege_type AS priv,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
                        AS grantee
             FROM pg_class AS c, aclexplode(c.relacl) AS a
             WHERE c.oid = format('%I.%I', nsp, legacy)::regclass
               AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON %I.%I TO %s', g.priv, nsp, parent, g.grantee);
        EXECUTE format('GRANT %s ON %I.%I TO %s', g.priv, nsp, parent || '_default',
                       g.grantee);
    END LOOP;
    FOR g IN SELECT t.attname AS col, a.privilege_type AS priv,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
                        AS grantee
             FROM pg_attribute AS t, aclexplode(t.attacl) AS a
             WHERE t.attrelid = format('%I.%I', nsp, legacy)::regclass
               AND t.attacl IS NOT NULL LOOP
        EXECUTE format('GRANT %s (%I) ON %I.%I TO %s', g.priv, g.col, nsp, parent, g.grantee);
    END LOOP;
END $$

-- ============================================================ spark
-- Run by relay.spark (psycopg, on the Spark driver and, in copy mode, on executors). Besides
-- the table placeholders: {stage} is a quoted staging table, {stage_literal} its bare name as
-- a string literal, {columns} the quoted column list the DataFrame writes, {column_defs} the
-- staging table's column definitions (types read from the catalog, so creating it needs no
-- SELECT on the outbox), {others} the written columns other than id, {order} the merge's
-- ORDER BY clause (or nothing). No parameters.

-- name: spark_table_columns
-- The outbox table's columns and types, to validate a DataFrame before anything is written.
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = {table_literal}::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- name: spark_table_schema
SELECT n.nspname::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = {table_literal}::regclass

-- name: spark_can_select_table
-- Spark's JDBC writer reads the target's schema with SELECT * after an append: a role without
-- SELECT on the outbox would have its rows written and the job failed.
SELECT has_table_privilege({table_literal}, 'SELECT')

-- name: spark_stage_lock
-- Held by the job's driver for the life of its staging table: cleanup drops only tables
-- whose lock it can take, i.e. whose job is gone.
SELECT pg_advisory_lock(hashtext('outbox-relay:stage'), hashtext({stage_literal}))

-- name: spark_stage_unlock
SELECT pg_advisory_unlock(hashtext('outbox-relay:stage'), hashtext({stage_literal}))

-- name: spark_stage_create
-- Same column types as the outbox (jsonb, uuid, ...), no constraints, no trigger, no WAL.
CREATE UNLOGGED TABLE {stage} ({column_defs})

-- name: spark_stage_drop
DROP TABLE IF EXISTS {stage}

-- name: spark_stage_schema
-- The schema of the staging tables (sql/migrations/0010), or NULL before that migration.
SELECT n.nspname::text FROM pg_namespace n WHERE n.nspname = {stage_schema_literal}

-- name: spark_stale_stages
-- Staging tables whose job no longer holds their lock, in the staging schema (and, from
-- before it existed, next to the outbox). The locks taken here are session locks of the
-- cleanup's own short-lived connection.
SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r'
  AND c.relname LIKE 'relay\_stage\_%'
  AND (n.nspname = {stage_schema_literal}
       OR c.relnamespace = (SELECT relnamespace FROM pg_class
                            WHERE oid = {table_literal}::regclass))
  AND pg_try_advisory_lock(hashtext('outbox-relay:stage'), hashtext(c.relname::text))

-- name: spark_copy_create
CREATE TEMPORARY TABLE {stage} ({column_defs}) ON COMMIT DROP

-- name: spark_conflicting_id
-- An id that two staged rows carry with different content: the write is refused. Equal
-- duplicates (a task that ran twice) are fine: the merge keeps one.
SELECT s.id::text
FROM {stage} AS s
WHERE s.id IN (SELECT id FROM {stage} GROUP BY id HAVING count(*) > 1)
GROUP BY s.id
HAVING count(DISTINCT ({others})) > 1
LIMIT 1

-- name: spark_copy_rows
COPY {stage} ({columns}) FROM STDIN

-- name: spark_merge
-- One statement, so the statement-level trigger wakes the relay once per job. ON CONFLICT
-- skips ids still in the outbox; NOT EXISTS skips ids already archived (on_success=archive).
-- {order} sorts the rows so the seq identity follows (ordering_key, order_by...). Returns
-- (rows staged, rows inserted).
WITH inserted AS (
    INSERT INTO {table} ({columns})
    SELECT {columns} FROM {stage} AS s
    WHERE NOT EXISTS (SELECT 1 FROM {archive} AS a WHERE a.id = s.id)
    {order}
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM {stage}), (SELECT count(*) FROM inserted)

-- ============================================================ streams (docs/streams.md)

-- name: stream_slots_ensure
-- Slots 0..$1-1 exist (a relay configured with more producers adds theirs).
INSERT INTO {stream_slots} (slot) SELECT generate_series(0, $1 - 1) ON CONFLICT DO NOTHING

-- name: stream_heartbeat
-- This relay ($1) is alive; returns how many stream relays are ($2: seconds a relay counts).
WITH me AS (
    INSERT INTO {stream_relays} (relay, seen_at) VALUES ($1, now())
    ON CONFLICT (relay) DO UPDATE SET seen_at = now()
), gone AS (
    DELETE FROM {stream_relays} WHERE seen_at < now() - make_interval(secs => $2 * 10)
)
SELECT 1 + count(*)::int FROM {stream_relays}
WHERE relay <> $1 AND seen_at >= now() - make_interval(secs => $2)

-- name: stream_slot_take
-- One free slot (never owned, released, or its lease run out) for this relay ($1) for $2 s;
-- below $3 only (the configured producers).
UPDATE {stream_slots} SET owner = $1, lease_until = now() + make_interval(secs => $2)
WHERE slot = (SELECT slot FROM {stream_slots}
              WHERE slot < $3 AND (owner IS NULL OR lease_until < now())
              ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING slot

-- name: stream_slot_renew
-- Keep the lease of slot $2 for relay $1 another $3 s; no row: the lease was lost (run out and
-- taken by another relay): stop using the slot at once. In the assigning transaction it also
-- holds the slot's row, so a takeover waits for that transaction.
UPDATE {stream_slots} SET lease_until = now() + make_interval(secs => $3)
WHERE slot = $2 AND owner = $1 AND lease_until >= now()
RETURNING slot

-- name: stream_slot_release
UPDATE {stream_slots} SET owner = NULL, lease_until = '-infinity' WHERE slot = $2 AND owner = $1

-- name: stream_identity
-- What names this outbox's stream producers (docs/streams.md, "Producer names"): the cluster's
-- system identifier, the database's oid and the stream table's. A physical copy (a standby, a
-- restore of a base backup) has all three, so a failover keeps the names and the broker's
-- deduplication; a logical copy (CREATE DATABASE ... TEMPLATE, pg_dump and restore) or another
-- schema's table has another.
SELECT concat_ws('/', (SELECT system_identifier FROM pg_control_system()),
                 (SELECT oid FROM pg_database WHERE datname = current_database()),
                 {stream_literal}::regclass::oid)

-- name: stream_last_given
-- The last publishing id given in slot $1 for stream $2 (0: none).
SELECT coalesce((SELECT last_id FROM {stream_seq} WHERE slot = $1 AND stream = $2), 0)

-- name: stream_legacy_of
-- The last publishing id given in slot $1 for stream $2 under the slot's old producer name
-- (sql/migrations/0022); NULL when the old name was never used there, or is done with.
SELECT last_id FROM {stream_legacy} WHERE slot = $1 AND stream = $2

-- name: stream_legacy_done
DELETE FROM {stream_legacy} WHERE slot = $1 AND stream = $2

-- name: stream_settle_stored
-- Rows of slot $1 in stream $2 at or below the broker's last stored publishing id ($3), when
-- the broker's mark is one this database gave: the broker stored them (their owner died before
-- deleting them). Delete them without sending; and never give an id at or below it again.
WITH done AS (
    DELETE FROM {stream_table} WHERE slot = $1 AND stream = $2 AND publishing_id <= $3
    RETURNING 1
), seq AS (
    INSERT INTO {stream_seq} (slot, stream, last_id) VALUES ($1, $2, $3)
    ON CONFLICT (slot, stream) DO UPDATE SET last_id = greatest({stream_seq}.last_id, $3)
)
SELECT count(*)::int FROM done

-- name: stream_send_again
-- The broker's mark for slot $1 in stream $2 ($3) is above any id the database ever gave there
-- (a restore, a failover to a standby that lagged, an old name two outboxes shared): which of
-- the slot's rows at or below $4 the broker stored cannot be told. They lose their ids and are
-- sent again with new ones above the mark (a duplicate at worst, never a loss); ids given from
-- now on start above the mark. How many rows.
WITH again AS (
    UPDATE {stream_table} SET slot = NULL, publishing_id = NULL
    WHERE slot = $1 AND stream = $2 AND publishing_id <= $4
    RETURNING 1
), seq AS (
    INSERT INTO {stream_seq} (slot, stream, last_id) VALUES ($1, $2, $3)
    ON CONFLICT (slot, stream) DO UPDATE SET last_id = greatest({stream_seq}.last_id, $3)
)
SELECT count(*)::int FROM again

-- name: stream_unsynced
-- Streams of the next $1 rows without a slot that are not in $2 (the streams whose broker mark
-- the slot knows, and those waiting): what the slot asks the broker about before it gives ids.
SELECT DISTINCT stream FROM (
    SELECT stream FROM {stream_table}
    WHERE slot IS NULL AND stream <> ALL ($2::text[]) ORDER BY seq LIMIT $1
) AS next

-- name: stream_assign
-- Give up to $2 rows without a slot to slot $1, each stream's rows the next publishing ids of
-- (slot, stream) in row order; only rows of the streams in $3, whose broker mark the slot
-- knows (ids are given above it); in a transaction that renewed the slot's lease first.
WITH picked AS (
    SELECT id, stream, seq FROM {stream_table}
    WHERE slot IS NULL AND stream = ANY ($3::text[])
    ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT id, stream, row_number() OVER (PARTITION BY stream ORDER BY seq) AS n FROM picked
), counts AS (
    SELECT stream, count(*) AS n FROM picked GROUP BY stream
), bumped AS (
    INSERT INTO {stream_seq} AS s (slot, stream, last_id)
    SELECT $1, stream, n FROM counts
    ON CONFLICT (slot, stream) DO UPDATE SET last_id = s.last_id + EXCLUDED.last_id
    RETURNING s.stream, s.last_id
)
UPDATE {stream_table} AS t
SET slot = $1, publishing_id = b.last_id - c.n + nb.n
FROM numbered AS nb
JOIN counts AS c USING (stream)
JOIN bumped AS b USING (stream)
WHERE t.id = nb.id
RETURNING t.id

-- name: stream_assigned
-- Slot $1's rows to send, in publishing id order per stream, at most $2 of each stream: a
-- stream that cannot take messages (missing, no leader) holds back only its own rows. The
-- slot's streams are found by walking the (slot, stream, publishing_id) index from one stream
-- to the next, not by reading every row of the slot.
WITH RECURSIVE streams AS (
    (SELECT stream FROM {stream_table} WHERE slot = $1 ORDER BY stream LIMIT 1)
    UNION ALL
    SELECT (SELECT t.stream FROM {stream_table} AS t
            WHERE t.slot = $1 AND t.stream > s.stream ORDER BY t.stream LIMIT 1)
    FROM streams AS s
    WHERE s.stream IS NOT NULL
)
SELECT r.id::text AS id, r.stream, r.content::text AS body, r.publishing_id
FROM streams AS s
CROSS JOIN LATERAL (
    SELECT t.id, t.stream, t.content, t.publishing_id FROM {stream_table} AS t
    WHERE t.slot = $1 AND t.stream = s.stream
    ORDER BY t.publishing_id
    LIMIT $2) AS r
WHERE s.stream IS NOT NULL
ORDER BY r.stream, r.publishing_id

-- name: stream_settle
-- Rows the broker confirmed ($1: ids).
DELETE FROM {stream_table} WHERE id = ANY ($1::uuid[])

-- name: stream_reassign
-- Rows the broker refused ($1: ids): a new publishing id at the next assignment (the old one
-- may be at or below what the broker stored since, and would be dropped).
UPDATE {stream_table} SET slot = NULL, publishing_id = NULL WHERE id = ANY ($1::uuid[])

-- name: stream_sleep_try
-- A relay whose slots all found nothing takes the stream table's wake-up lock before it
-- sleeps (sql/migrations/0019): producers send a NOTIFY while it holds it. 'held': taken;
-- 'writing': producers hold it shared (they are writing now: no sleep is needed); 'peer':
-- another relay holds it (it sleeps, producers NOTIFY, and every relay LISTENs). The shared
-- try is given back at once. notifying: the producers' trigger is on (`RELAY_NOTIFY=off`
-- turns it off: then nothing wakes a sleeper, and slots poll).
SELECT CASE
           WHEN pg_try_advisory_lock({wakeup_lock_class}, {stream_literal}::regclass::oid::int)
               THEN 'held'
           WHEN pg_try_advisory_lock_shared({wakeup_lock_class},
                                            {stream_literal}::regclass::oid::int)
               AND pg_advisory_unlock_shared({wakeup_lock_class},
                                             {stream_literal}::regclass::oid::int)
               THEN 'writing'
           ELSE 'peer'
       END AS state,
       COALESCE((SELECT t.tgenabled <> 'D' FROM pg_trigger AS t
                 WHERE t.tgrelid = {stream_literal}::regclass
                   AND t.tgname = {stream_notify_trigger_literal}), false) AS notifying

-- name: stream_sleep_check
-- Right after the lock is taken (a new statement, a snapshot that sees every producer that
-- committed without a NOTIFY): are rows waiting for a slot?
SELECT EXISTS (SELECT 1 FROM {stream_table} WHERE slot IS NULL)

-- name: stream_sleep_release
SELECT pg_advisory_unlock({wakeup_lock_class}, {stream_literal}::regclass::oid::int)

-- name: stream_park
-- Rows that can never be sent ($1: ids) move to the stream dead letters with reason $2, through
-- {stream_park_fn} (sql/migrations/0020_stream_definer_functions.sql: the relay role has no
-- INSERT on them); how many.
SELECT {stream_park_fn}($1::uuid[], $2::text)

-- name: stream_dead_list
-- `relay dead list --streams`: parked stream rows, oldest first ($1: reason code or NULL, $2:
-- at most).
SELECT id::text AS id, dead_at, stream, octet_length(content::text) AS bytes, reason
FROM {stream_dead}
WHERE ($1::text IS NULL OR lower(split_part(reason, ':', 1)) = lower($1))
ORDER BY dead_at, dead_id
LIMIT $2

-- name: stream_dead_ids
-- The parked stream rows of a reason code ($1), oldest first: what a replay by reason moves.
-- Replay moves an id's latest parking, so an id counts when its latest parking has that code.
SELECT id::text FROM {stream_dead}
WHERE dead_id IN (SELECT max(dead_id) FROM {stream_dead} GROUP BY id)
  AND lower(split_part(reason, ':', 1)) = lower($1)
ORDER BY dead_at, dead_id

-- name: stream_dead_replay
-- `relay dead replay --streams`: parked stream rows back into the stream table, same id and
-- content, to be sent again ($1: ids or NULL for all; a reason is resolved to ids by
-- stream_dead_ids first, so that it matches as the other statements' do, and the function's
-- own reason filter is not used), through {stream_replay_fn}
-- (sql/migrations/0020_stream_definer_functions.sql): the relay role has no INSERT on the
-- stream table. The ids moved.
SELECT {stream_replay_fn}($1::uuid[], NULL)

-- name: stream_status
-- `relay status`: rows waiting for their streams, how long the oldest has waited, and rows
-- parked because they can never be sent.
SELECT count(*)::bigint AS stream_rows,
       LEAST(GREATEST(COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0), 0),
             3155760000)::float8 AS stream_oldest_age_s,
       (SELECT count(*) FROM {stream_dead})::bigint AS stream_dead_rows
FROM {stream_table}
