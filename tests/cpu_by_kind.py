"""Where a command's CPU goes, by kind of process: runs the command, reads every process's CPU
time from /proc once a second while it runs, and prints the seconds each kind used (relays,
the test workers, PostgreSQL, Erlang, Spark's JVMs, ...), the machine's whole, not only the
command's children: the servers' work for the tests counts too.

    .venv/bin/python tests/cpu_by_kind.py -- .venv/bin/python tests/run.py -q

A process is counted from the sample it is first seen at (one started less than two seconds
before counts from its start); one that ends between two samples loses up to a second, so short
lives are undercounted. A process is classified again when its name changes (a shell script
that execs Erlang counts as Erlang from then on). Exit status: the command's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


# (kind, test of (name, command line)), the first that matches wins.
KINDS: list[tuple[str, Callable[[str, str], bool]]] = [
    ("relay", lambda n, c: "relay.cli" in c or "/bin/relay " in c or c.endswith("/bin/relay")),
    ("Spark JVM (3.5)", lambda n, c: n == "java" and "spark-3.5" in c),
    ("JVM (Spark 4)", lambda n, c: n == "java"),
    ("Spark's Python workers", lambda n, c: "pyspark.daemon" in c or "pyspark.worker" in c),
    ("Erlang (RabbitMQ)",
     lambda n, c: n in ("beam.smp", "erl_child_setup", "epmd", "inet_gethost", "erl")),
    ("PostgreSQL", lambda n, c: n.startswith("postgres") or n in ("initdb", "pg_ctl")),
    ("pytest and its workers",
     lambda n, c: "pytest" in c or "execnet" in c or " -u -c " in f" {c} "),
    ("Docker engine", lambda n, c: n in ("dockerd", "containerd", "containerd-shim", "runc")),
]


def kind(comm: str, cmdline: str) -> str:
    """The kind of a process, from its name and command line."""
    for what, matches in KINDS:
        if matches(comm, cmdline):
            return what
    if comm.startswith("python"):
        return "other Python: " + " ".join(cmdline.split()[1:3])[:40]
    return "other: " + comm


def _read(pid: str) -> tuple[str, float, str] | None:
    """(start time, CPU seconds, name) of a process, or None once it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    name, _, rest = stat.partition(" (")[2].rpartition(") ")
    fields = rest.split()
    return fields[19], (int(fields[11]) + int(fields[12])) / TICK, name


def _cmdline(pid: str) -> str:
    try:
        return (PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Sampler:
    def __init__(self) -> None:
        self.used: defaultdict[str, float] = defaultdict(float)
        self._seen: dict[tuple[str, str], tuple[float, str, str]] = {}
        self._stop = threading.Event()

    def sample(self, first: bool = False) -> None:
        uptime = float((PROC / "uptime").read_text().split()[0])
        for pid in (p for p in os.listdir(PROC) if p.isdigit()):
            read = _read(pid)
            if read is None:
                continue
            start, cpu, name = read
            key = (pid, start)
            known = self._seen.get(key)
            if known is None:
                young = uptime - int(start) / TICK < 2.0
                known = (0.0 if young and not first else cpu, name, kind(name, _cmdline(pid)))
            before, old_name, what = known
            if name != old_name:
                what = kind(name, _cmdline(pid))
            self.used[what] += cpu - before
            self._seen[key] = (cpu, name, what)

    def run(self) -> None:
        self.sample(first=True)
        while not self._stop.wait(1.0):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def report(used: dict[str, float], wall: float) -> str:
    total = sum(used.values())
    lines = [f"{wall:.0f} s of wall time, {total:.0f} CPU-seconds "
             f"({total / wall / (os.cpu_count() or 1):.0%} of {os.cpu_count()} CPUs)"]
    for what, seconds in sorted(used.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.5:
            lines.append(f"{seconds:8.1f} s {seconds / total:6.1%}  {what}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    sampler = Sampler()
    thread = threading.Thread(target=sampler.run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        status = subprocess.run(argv, check=False).returncode
    finally:
        sampler.stop()
        thread.join()
        sampler.sample()
        print(report(sampler.used, time.monotonic() - started), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
