"""A private RabbitMQ node a test owns: started, stopped, alarmed or clustered at will.

Tests that touch broker-wide state (stop_app/start_app, memory alarms, cluster membership) run
on such a node, never on the shared one. Each node gets its own node name
(`relaytest-<id>@localhost`), AMQP and distribution ports, and a temporary folder for its
database, logs and config (owned by the `rabbitmq` user when the tests run as root, since the
node must read the cookie in that user's home). Management and every other plugin are off.

Every method blocks (rabbitmqctl is an Erlang VM start of its own, ~1 s): async tests call them
through `asyncio.to_thread` so that producers and consumers on the event loop keep running.

    node = RabbitNode().start()
    try:
        url = node.url           # amqp://guest:guest@127.0.0.1:<port>/
        node.stop_app(); node.start_app()
        node.set_memory_alarm(True); node.set_memory_alarm(False)
        other = RabbitNode().start(); other.join_cluster(node)
    finally:
        node.destroy()
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.kit.ports import free_port

SERVER_BIN_DIRS = ("/usr/lib/rabbitmq/bin", "/usr/lib/rabbitmq/sbin")
# The memory high watermark the node starts with, restored when an alarm is cleared.
MEMORY_WATERMARK = 0.4
# A watermark so low that any node is above it: the memory alarm goes off at once.
ALARM_WATERMARK = 0.0000001


def _tool(name: str) -> str:
    """The real script (not Debian's su wrapper, which drops to the rabbitmq user itself)."""
    for folder in SERVER_BIN_DIRS:
        path = Path(folder, name)
        if path.exists():
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install the rabbitmq-server package")
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RabbitNodeError(RuntimeError):
    """A private RabbitMQ node did not do what was asked; the message quotes its log."""


class RabbitNode:
    """One private RabbitMQ node on 127.0.0.1 (guest/guest), in a temporary folder."""

    def __init__(self, prefix: str = "relaytest", *,
                 stream_advertised_port: int | None = None) -> None:
        """`stream_advertised_port`: also run the stream plugin (on `stream_port`), telling
        clients to connect to that port for every stream's leader (a proxy's, so that every
        stream connection goes through it)."""
        self.name = f"{prefix}-{secrets.token_hex(4)}"
        self.nodename = f"{self.name}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.stream_port = free_port()
        self._stream_advertised_port = stream_advertised_port
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.log_path = self.root / "stdout.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._user = self._rabbitmq_user()
        for sub in ("mnesia", "log"):
            (self.root / sub).mkdir()
        self._write_config()

    def _write_config(self) -> None:
        """The node's rabbitmq.conf and enabled_plugins (owned by the node's user)."""
        config = (
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
            f"vm_memory_high_watermark.relative = {MEMORY_WATERMARK}\n"
            "loopback_users.guest = true\n"
        )
        plugins = "[]"
        if self._stream_advertised_port is not None:
            config += (f"stream.listeners.tcp.1 = 127.0.0.1:{self.stream_port}\n"
                       "stream.advertised_host = 127.0.0.1\n"
                       f"stream.advertised_port = {self._stream_advertised_port}\n")
            plugins = "[rabbitmq_stream]"
        (self.root / "rabbitmq.conf").write_text(config)
        (self.root / "enabled_plugins").write_text(f"{plugins}.\n")
        (self.root / "rabbitmq-env.conf").touch()
        if self._user is not None:
            for path in (self.root, *self.root.rglob("*")):
                shutil.chown(path, self._user.pw_name, self._user.pw_gid)

    @staticmethod
    def _rabbitmq_user() -> pwd.struct_passwd | None:
        """As root, the node runs as `rabbitmq` (it owns the Erlang cookie); else as we are."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("rabbitmq")
        except KeyError:
            return None

    @property
    def url(self) -> str:
        """AMQP URL of the node (the default guest user, loopback only)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.root / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.root / "log"),
            RABBITMQ_CONFIG_FILE=str(self.root / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.root / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.root / "node.pid"),
            # An empty env file: the machine's rabbitmq-env.conf names the shared node.
            RABBITMQ_CONF_ENV_FILE=str(self.root / "rabbitmq-env.conf"),
        )
        if self._user is not None:
            env.update(HOME=self._user.pw_dir, USER=self._user.pw_name,
                       LOGNAME=self._user.pw_name)
        return env

    def _as_user(self) -> list[str]:
        return ["runuser", "-u", self._user.pw_name, "--"] if self._user is not None else []

    def ctl(self, *args: str, timeout_s: float = 120.0) -> str:
        """Run `rabbitmqctl -n <node> <args>`; return its output, raise with it on failure."""
        out = subprocess.run(
            [*self._as_user(), _tool("rabbitmqctl"), "-n", self.nodename, *args],
            env=self._env(), capture_output=True, text=True, timeout=timeout_s, check=False,
            cwd=self.root,
        )
        if out.returncode != 0:
            raise RabbitNodeError(
                f"rabbitmqctl -n {self.nodename} {' '.join(args)} exited {out.returncode}: "
                f"{(out.stdout + out.stderr)[-2000:]}"
            )
        return out.stdout

    def start(self, timeout_s: float = 120.0) -> RabbitNode:
        """Start the node and wait until it has booted and its AMQP listener accepts
        connections. A boot that fails because a port was taken meanwhile (`eaddrinuse`: the
        ports were free when picked) is tried once more on a new AMQP and distribution port
        (the stream port stays: a proxy may already forward to it). A node that failed to start
        leaves nothing behind."""
        try:
            try:
                return self._start(timeout_s)
            except RabbitNodeError:
                if "eaddrinuse" not in self.log_tail(1_000_000).lower():
                    raise
            self.kill()
            shutil.rmtree(self.root / "mnesia", ignore_errors=True)
            (self.root / "mnesia").mkdir()
            self.port, self.dist_port = free_port(), free_port()
            self._write_config()
            return self._start(timeout_s)
        except BaseException:
            self.destroy()
            raise

    def _start(self, timeout_s: float) -> RabbitNode:
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [*self._as_user(), _tool("rabbitmq-server")], env=self._env(), stdout=log,
            stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True,
        )
        log.close()
        try:
            self._await_boot(timeout_s)
            self._wait_listener(True, 10)  # booted, so its listener is open: confirm it
        except RabbitNodeError as e:
            raise RabbitNodeError(f"{e}\n{self.nodename} log: {self.log_tail()}") from None
        return self

    def _await_boot(self, timeout_s: float) -> None:
        """Return once the node's application has booted (`rabbitmqctl await_startup`, asked
        again while the VM has not registered its name yet); raise when the VM exits or the
        boot fails. Something else listening on the node's port proves nothing, so the port is
        not what is waited for."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RabbitNodeError(f"{self.nodename} exited with {self._proc.returncode} "
                                      "while booting")
            left = deadline - time.monotonic()
            try:
                self.ctl("await_startup", "--timeout", str(max(1, int(left))),
                         timeout_s=max(1.0, left) + 10)
                return
            except RabbitNodeError as e:
                not_up_yet = ("not running at all" in str(e)  # its name not registered yet
                              or "unable to connect to epmd" in str(e)  # epmd not started yet
                              # the VM answers, its boot has not reached the application yet
                              # (exit 69; seen in CI under load)
                              or "'rabbit' application not running" in str(e))
                if not not_up_yet or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def _wait_listener(self, up: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while _port_open(self.port) != up:
            if self._proc is not None and self._proc.poll() is not None and up:
                raise RabbitNodeError(f"{self.nodename} exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                state = "listening" if up else "closed"
                raise RabbitNodeError(f"{self.nodename}: port {self.port} not {state} after "
                                      f"{timeout_s}s: {self.log_tail()}")
            time.sleep(0.1)

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (the Erlang node stays up); returns once the AMQP
        listener is closed, so every client connection has been dropped."""
        self.ctl("stop_app")
        self._wait_listener(False, 30)

    def start_app(self, timeout_s: float = 120.0) -> None:
        """Start the application again; returns once the AMQP listener accepts connections."""
        self.ctl("start_app", timeout_s=timeout_s)
        self._wait_listener(True, timeout_s)

    def set_memory_alarm(self, on: bool) -> None:
        """Raise (or clear) the memory alarm: publishing connections get connection.blocked."""
        watermark = ALARM_WATERMARK if on else MEMORY_WATERMARK
        self.ctl("set_vm_memory_high_watermark", f"{watermark:f}")

    def join_cluster(self, seed: RabbitNode) -> None:
        """Make this node a disc member of `seed`'s cluster (stop_app, reset, join, start_app)."""
        self.ctl("stop_app")
        self.ctl("reset")
        self.ctl("join_cluster", seed.nodename)
        self.start_app()

    def cluster_nodes(self) -> list[str]:
        """Names of the running nodes of this node's cluster."""
        status = json.loads(self.ctl("cluster_status", "--formatter", "json"))
        return sorted(status["running_nodes"])

    def kill(self) -> None:
        """kill -9 what the node's start began (the wrapper script and the VM; not epmd, which
        detaches and serves the shared broker too): a hard crash, no connection is closed
        cleanly."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop the node (cleanly; a hard kill when that fails)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            self.ctl("stop", timeout_s=60)
            self._proc.wait(timeout=60)
        except (RabbitNodeError, subprocess.TimeoutExpired):
            self.kill()

    def destroy(self) -> None:
        """Stop the node and remove its folder."""
        try:
            self.stop()
        finally:
            if self._proc is not None and self._proc.poll() is None:
                self.kill()
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the node's console output and main log, for failure messages."""
        texts = [self.log_path.read_text(errors="replace")] if self.log_path.exists() else []
        texts += [p.read_text(errors="replace") for p in (self.root / "log").glob("*.log")]
        return "\n".join(texts)[-chars:]
