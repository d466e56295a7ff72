"""A private, throwaway PostgreSQL cluster that a test may stop and start (the shared one must
never be restarted). Built with initdb and pg_ctl from /usr/lib/postgresql/*/bin."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: install the PostgreSQL server package")
    return path


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """initdb + pg_ctl in a temporary folder, on a free port, trust auth for user postgres."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="relay-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        # initdb refuses to run as root: run the server tools as the postgres user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")

    @property
    def dsn(self) -> str:
        """Admin DSN of the cluster's postgres database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout_s: float = 120) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=timeout_s)

    def init(self) -> PrivateCluster:
        """Create the cluster (fsync off: it is thrown away)."""
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")
        return self

    def start(self) -> None:
        """Start and wait until it accepts connections."""
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=50")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop (fast: roll back open transactions and close connections)."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        """Stop whatever runs and remove the folder."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
