-- Stream producer names of their own per outbox (docs/streams.md, "Producer names"). Until this
-- migration a slot's producer was named `<table>-<slot>`: the same in every database that kept
-- the default table name, and the broker keeps one high-water mark per (name, stream), so two
-- outboxes writing to one stream had each other's messages dropped as duplicates. The relay now
-- names a slot's producer after the database it runs in as well (computed at start, no column).
--
-- What the old names were used for stays provable: for each (slot, stream), the last publishing
-- id given before this migration. A relay that takes a slot over asks the broker what it stored
-- under the old name and settles or sends again the rows given ids at or below this (then the
-- entry goes). Rows given ids after it go out under the new name.
CREATE TABLE IF NOT EXISTS {stream_legacy} (
    slot    integer NOT NULL,
    stream  text    NOT NULL,
    last_id bigint  NOT NULL,
    PRIMARY KEY (slot, stream)
);
INSERT INTO {stream_legacy} (slot, stream, last_id)
SELECT slot, stream, last_id FROM {stream_seq}
ON CONFLICT (slot, stream) DO NOTHING;
