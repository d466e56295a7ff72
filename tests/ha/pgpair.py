"""A private PostgreSQL primary and its streaming standby on their own ports (never the shared
server): initdb, pg_basebackup -R, pg_ctl promote; the primary can be killed with -9."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.chaos.pgcluster import PrivateCluster, _bin


def _children(pid: int) -> list[int]:
    """Direct children of a process (the postmaster's backends and auxiliary processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


class PrimaryStandby:
    """Two clusters: `primary` (initdb) and `standby` (pg_basebackup -R from it, streaming)."""

    def __init__(self) -> None:
        self.primary = PrivateCluster()
        self.standby = PrivateCluster()

    def start(self) -> PrimaryStandby:
        """Create and start both; the standby streams from the primary."""
        self.primary.init()
        self.primary.start()
        self.standby._run(
            _bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", "postgres", "-D", str(self.standby.data), "-R", "-X", "stream",
            "--no-sync", "-c", "fast",
        )
        self.standby.start()
        return self

    def hosts_url(self, database: str = "postgres") -> str:
        """The libpq multi-host URL naming both servers, primary first."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},"
                f"127.0.0.1:{self.standby.port}/{database}?target_session_attrs=read-write")

    def hosts_keywords(self, database: str = "postgres") -> str:
        """The same in libpq's keyword form."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
                f"user=postgres dbname={database} target_session_attrs=read-write")

    def kill_primary(self) -> None:
        """kill -9 the primary's postmaster and every process it started (a host that died)."""
        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

    def promote(self) -> None:
        """Promote the standby and wait until it accepts writes."""
        self.standby._run(_bin("pg_ctl"), "-D", str(self.standby.data), "-w", "promote")

    def destroy(self) -> None:
        """Stop both (whatever still runs) and remove their folders."""
        self.standby.destroy()
        self.primary.destroy()
