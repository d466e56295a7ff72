-- Dead letters (rows that cannot be published, with the reason) and the archive of published
-- rows (RELAY_ON_SUCCESS=archive). Both keep every column of the outbox row.

CREATE TABLE IF NOT EXISTS {dead} (
    id           uuid PRIMARY KEY,
    seq          bigint,
    exchange     text,
    routing_key  text,
    content      jsonb,
    options      jsonb,
    created_at   timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    attempts     integer NOT NULL,
    last_error   text,
    ordering_key text,
    reason       text NOT NULL,
    dead_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {name}_dead_dead_at_idx ON {dead} (dead_at);

CREATE TABLE IF NOT EXISTS {archive} (
    id           uuid PRIMARY KEY,
    seq          bigint,
    exchange     text,
    routing_key  text,
    content      jsonb,
    options      jsonb,
    created_at   timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    attempts     integer NOT NULL,
    last_error   text,
    ordering_key text,
    published_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {name}_archive_published_at_idx ON {archive} (published_at);
