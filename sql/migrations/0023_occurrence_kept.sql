-- A recurring row's occurrence (`x-outbox-occurrence`, docs/recurring.md) is the time it was
-- due, and an inbox tells one occurrence from the next by it. A retry or a postponement (its
-- destination silent) moves available_at; the occurrence must stay the one that first went
-- out, or a consumer would handle one occurrence twice under two keys. occurrence_at holds it
-- while the row waits for its next try (NULL: the occurrence is available_at); the settle that
-- schedules the next occurrence clears it. A nullable column without a default: no rewrite.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS occurrence_at timestamptz;

-- Whoever may reschedule rows (UPDATE of available_at: the relay role of sql/roles.sql, under
-- any name) may keep the occurrence too, so relays running as that role need no new grant.
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
        EXECUTE format('GRANT UPDATE (occurrence_at) ON %s TO %s', {table_literal}, grantee);
    END LOOP;
END $$;
