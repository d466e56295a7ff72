-- Rows for streams wake a sleeping relay at once (docs/streams.md). A relay whose stream slots
-- all found nothing to send sleeps holding the stream table's wake-up lock (the outbox's lock
-- class, the stream table's oid) exclusively, and LISTENs on the table's channel with
-- `_stream`. A producer's INSERT statement takes the same lock shared, for its transaction, when
-- it can: then no relay sleeps and it sends nothing; when it cannot, a relay sleeps and it
-- sends one NOTIFY. Producers that write while the relays are busy pay no NOTIFY at all (a
-- NOTIFY serialises the commits of every session that sends one).
CREATE OR REPLACE FUNCTION {stream_notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared({wakeup_lock_class}, TG_RELID::int) THEN
        PERFORM pg_notify({stream_channel_literal}, '');
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS {stream_notify_trigger} ON {stream_table};
CREATE TRIGGER {stream_notify_trigger} AFTER INSERT ON {stream_table}
    FOR EACH STATEMENT EXECUTE FUNCTION {stream_notify_fn}();
