"""What a relay imports at start-up: the stream driver's client library (rstream) only when
streams are on. Every relay process of the suite, and every restart in production, pays for
what relay.app imports."""

from __future__ import annotations

import subprocess
import sys


def _imported_after(statement: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{statement}\nimport sys\n"
                          "print('\\n'.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, timeout=60)
    return set(out.stdout.split())


def test_relay_app__does_not_import_the_stream_client_until_streams_are_on() -> None:
    assert "rstream" not in _imported_after("import relay.app, relay.cli.main")


def test_stream_worker__imports_the_stream_client_when_asked_for() -> None:
    statement = ("from relay.app import stream_config\n"
                 "from relay.settings import Settings\n"
                 "stream_config(Settings(pg_dsn='postgresql://x@127.0.0.1/x', streams=True))")
    assert "rstream" in _imported_after(statement)
