-- Stream rows that can never be sent (docs/streams.md): a row whose message is larger than the
-- stream connection's frame_max (RabbitMQ's `stream.frame_max`, 1 MiB by default) would be sent
-- again and again and hold every later row of its slot behind it. The relay moves it here with
-- its reason instead, in one statement; `relay status` counts these rows. Once the limit is
-- raised, an operator moves them back (docs/streams.md gives the statement).
CREATE TABLE IF NOT EXISTS {stream_dead} (
    dead_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id         uuid        NOT NULL,
    stream     text        NOT NULL,
    content    jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    reason     text        NOT NULL,
    dead_at    timestamptz NOT NULL DEFAULT now()
);
