"""sql/schema.sql is the current schema, in one place: exactly what `relay migrate` leaves in a
new database for the default table (`queue_message`), so a reader need not replay the
migrations (a function's current body is otherwise only in the last migration that replaced
it). When a migration changes the schema, write the file again:

    .venv/bin/python -m tests.integration.test_schema_file postgresql://postgres@127.0.0.1/<db>

with <db> a database `relay migrate` has just migrated from nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"
HEADER = """\
-- The current schema of one outbox table (RELAY_TABLE=queue_message), as `relay migrate` leaves
-- it in a new database: generated with pg_dump --schema-only --no-owner --no-privileges from a
-- database migrated from nothing, and checked against one in every test run
-- (tests/integration/test_schema_file.py, which also writes it again). Read it to see what is
-- there now; change the schema only through a new migration in sql/migrations/.
"""
# pg_dump's own lines that say nothing about the schema: comments, session settings, and the
# \\restrict guard whose key is new in every dump.
NOISE = ("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")


def dump(dsn: str) -> str:
    """The database's schema as pg_dump writes it, without its noise, blank runs folded."""
    out = subprocess.run(["pg_dump", "--schema-only", "--no-owner", "--no-privileges",
                          f"--dbname={dsn}"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    lines = [line.rstrip() for line in out.splitlines() if not line.startswith(NOISE)]
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"


def body(text: str) -> str:
    """The file without its header."""
    return "\n".join(line for line in text.splitlines()
                     if not line.startswith("--")).strip() + "\n"


def test_schema_file__is_what_relay_migrate_leaves_in_a_new_database(db: str) -> None:
    now = dump(db)
    assert body(SCHEMA.read_text()) == now, (
        "sql/schema.sql is not the schema `relay migrate` leaves: write it again "
        "(see tests/integration/test_schema_file.py)")


if __name__ == "__main__":
    SCHEMA.write_text(HEADER + "\n" + dump(sys.argv[1]))
    print(f"wrote {SCHEMA}")
