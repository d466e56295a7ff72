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
-- Whoever may give ids (UPDATE on {stream_seq}: the relay role of sql/roles.sql, under any name)
-- may read and forget these, so that relays running as that role need no new grant to start.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = {stream_seq_literal}::regclass AND a.privilege_type = 'UPDATE'
          AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT, DELETE ON %s TO %s', {stream_legacy_literal}, grantee);
    END LOOP;
END $$;
