-- Rows for RabbitMQ streams (docs/streams.md): a table of their own beside the outbox, published
-- over the stream protocol by a relay with RELAY_STREAMS=true, deduplicated by the broker.
--
-- A producer names the stream in the row. Before a row is sent, a relay gives it a producer
-- slot and a publishing id in a committed transaction: slot k is the stream producer named
-- `<table>-<k>`, owned by one relay at a time (a lease in {stream_slots}); ids rise by one per
-- (slot, stream) ({stream_seq} holds the last given). The broker keeps, per producer name and
-- stream, the highest publishing id it stored and drops any message at or below it, so a row
-- sent again after a crash (same slot, same id) is never written twice.
CREATE TABLE IF NOT EXISTS {stream_table} (
    id            uuid        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    seq           bigint      GENERATED ALWAYS AS IDENTITY,
    stream        text        NOT NULL CHECK (stream <> '' AND octet_length(stream) <= 255),
    content       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    slot          integer,
    publishing_id bigint,
    CONSTRAINT {stream_assigned_check} CHECK ((slot IS NULL) = (publishing_id IS NULL))
);

-- What a relay assigns next: rows without a slot, oldest first.
CREATE INDEX IF NOT EXISTS {stream_unassigned_idx} ON {stream_table} (seq) WHERE slot IS NULL;
-- What a slot's owner sends, in publishing id order; also what it settles on takeover.
CREATE UNIQUE INDEX IF NOT EXISTS {stream_assigned_idx}
    ON {stream_table} (slot, stream, publishing_id) WHERE slot IS NOT NULL;

CREATE TABLE IF NOT EXISTS {stream_slots} (
    slot        integer     PRIMARY KEY,
    owner       text,
    lease_until timestamptz NOT NULL DEFAULT '-infinity'
);

CREATE TABLE IF NOT EXISTS {stream_seq} (
    slot    integer NOT NULL,
    stream  text    NOT NULL,
    last_id bigint  NOT NULL,
    PRIMARY KEY (slot, stream)
);

-- Relays running streams, each seen every few seconds: how many share the slots.
CREATE TABLE IF NOT EXISTS {stream_relays} (
    relay   text        PRIMARY KEY,
    seen_at timestamptz NOT NULL
);
