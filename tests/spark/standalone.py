"""A Spark standalone cluster on this machine: one master and one worker, started from the
installed pyspark's own launcher (`bin/spark-class`; nothing downloaded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.kit.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent


def cluster_env() -> dict[str, str]:
    """What the cluster's processes and spark-submit run with: this pyspark and interpreter."""
    env = dict(os.environ)
    env |= {
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_NO_DAEMONIZE": "1",
    }
    return env


@dataclass
class Standalone:
    """Master and worker processes (each in its own process group, killed as one)."""

    workdir: Path
    cores: int = 2
    memory: str = "1200m"
    port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        """spark://127.0.0.1:<port>."""
        return f"spark://127.0.0.1:{self.port}"

    def _launch(self, name: str, *args: str) -> Path:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            self.procs.append(subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                stdout=out, stderr=subprocess.STDOUT, env=cluster_env(),
                start_new_session=True,
            ))
        return log

    def _wait_for(self, log: Path, text: str, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a standalone process exited; see {log}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)  # polling a log file: no event to wait on
        raise RuntimeError(f"{text!r} not in {log} after {timeout_s}s")

    def start(self) -> Standalone:
        """Start the master, then the worker; return when the worker has registered."""
        master = self._launch(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(free_port()))
        self._wait_for(master, "I have been elected leader")
        worker = self._launch(
            "worker", "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
            "--webui-port", str(free_port()), "--work-dir", str(self.workdir / "work"))
        self._wait_for(worker, "Successfully registered with master")
        return self

    def stop(self) -> None:
        """SIGTERM each process group (worker first: it ends its executors), then SIGKILL."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def submit(self, script: Path, *args: str, env: dict[str, str],
               timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        """spark-submit `script` to this master (client mode), with the JDBC jar."""
        from relay.spark import jdbc_jar

        cmd = [
            str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url,
            "--jars", jdbc_jar(), "--driver-memory", "512m", "--executor-memory", "700m",
            "--total-executor-cores", str(self.cores),
            "--conf", f"spark.pyspark.python={sys.executable}",
            str(script), *args,
        ]
        return subprocess.run(cmd, env=cluster_env() | env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
