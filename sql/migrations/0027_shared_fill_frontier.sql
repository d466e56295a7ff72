-- Where the fills of every relay's claims start while a backlog drains: above the highest seq
-- that a full claim's fill took, whichever relay made it (relay/pg/seqfloor.py). Each relay
-- kept its own, so with 4 relays of 3 lanes a claim still stepped over the rows the other
-- relays' claims had locked since its last one (SKIP LOCKED reads each): the claim read three
-- times the buffers per message at 4 relays that it read at 1. A sequence, because its value
-- changes outside transactions: a claim moves it inside its own long transaction (the rows stay
-- locked while they are published) without a row lock that another claim would wait for. A
-- claim that comes back short (no backlog above it) or a batch that gives rows back sets it to
-- the lowest bigint again: every fill then starts at its relay's floor.
CREATE SEQUENCE IF NOT EXISTS {fill_frontier} AS bigint
    MINVALUE -9223372036854775808 START WITH -9223372036854775808 NO CYCLE;

-- Whoever may claim rows (the relay role of `relay migrate --roles`, under any name: who may
-- reschedule rows, UPDATE of available_at) reads and moves it.
DO $$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_attribute AS att, aclexplode(att.attacl) AS a
        WHERE att.attrelid = {table_literal}::regclass AND att.attname = 'available_at'
          AND a.privilege_type = 'UPDATE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT, UPDATE ON SEQUENCE %s TO %s', {fill_frontier_literal},
                       grantee);
    END LOOP;
END $$;
