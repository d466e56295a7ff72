"""A private 3-node RabbitMQ cluster beside the shared broker (tests/servers/rabbitmq_node.py
nodes: own node names, AMQP and distribution ports, folders owned by the rabbitmq user, whose
Erlang cookie they share), and which node a process's AMQP connections are on."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.servers.rabbitmq_node import RabbitNode, _tool

# Node names (and folders) of cluster nodes start with this: what remove_strays looks for.
PREFIX = "relayha"


class RabbitCluster:
    """`size` nodes joined into one cluster; node 0 is the seed the others join."""

    def __init__(self, size: int = 3) -> None:
        self.nodes = [RabbitNode(prefix=PREFIX) for _ in range(size)]
        self.stopped: set[str] = set()  # node names whose application is stopped

    def stop_node(self, node: RabbitNode) -> None:
        """Stop a node's application: its clients are disconnected, the others carry on."""
        node.stop_app()
        self.stopped.add(node.nodename)

    def start_node(self, node: RabbitNode) -> None:
        """Start a stopped node's application again (it rejoins its cluster)."""
        node.start_app()
        self.stopped.discard(node.nodename)

    def quorum_safe_to_stop(self, node: RabbitNode) -> bool:
        """No quorum queue would lose its majority if `node` stopped now (a member that has
        just come back may still be catching up)."""
        out = subprocess.run(
            [*node._as_user(), _tool("rabbitmq-queues"), "-n", node.nodename,
             "check_if_node_is_quorum_critical"],
            env=node._env(), capture_output=True, text=True, timeout=120, check=False,
            cwd=node.root,
        )
        return out.returncode == 0

    def quorum_status(self, queue: str) -> str:
        """`rabbitmq-queues quorum_status` of a queue, asked of a running node: each member's
        raft state (leader, follower...), commit index and last applied entry."""
        node = self.running()[0]
        out = subprocess.run(
            [*node._as_user(), _tool("rabbitmq-queues"), "-n", node.nodename,
             "quorum_status", queue, "--formatter", "json"],
            env=node._env(), capture_output=True, text=True, timeout=120, check=False,
            cwd=node.root,
        )
        return (out.stdout + out.stderr).strip()

    def queue_depth(self, queue: str) -> str:
        """The queue's messages (ready and unacknowledged) and consumers, as a running node
        sees them: rows the relays published that the test's consumers have not taken yet."""
        out = self.running()[0].ctl("list_queues", "name", "messages", "messages_ready",
                                    "messages_unacknowledged", "consumers", "--quiet")
        return next((line for line in out.splitlines() if line.split()[:1] == [queue]),
                    f"{queue} not listed: {out.strip()}")

    def running(self) -> list[RabbitNode]:
        """The nodes whose application runs."""
        return [n for n in self.nodes if n.nodename not in self.stopped]

    def start(self) -> RabbitCluster:
        """Start every node (in parallel), then join the others to the seed."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.start(), self.nodes))
        seed, *others = self.nodes
        for node in others:
            node.join_cluster(seed)
        running = seed.cluster_nodes()
        if len(running) != len(self.nodes):
            raise RuntimeError(f"cluster formed with {running} only")
        return self

    @property
    def urls(self) -> list[str]:
        """AMQP URL of every node."""
        return [node.url for node in self.nodes]

    def node_named(self, nodename: str) -> RabbitNode:
        """The node of that Erlang node name."""
        return next(n for n in self.nodes if n.nodename == nodename)

    def connections_by_port(self, via: RabbitNode) -> dict[int, str]:
        """Client port -> node name of every AMQP connection in the cluster."""
        out = via.ctl("list_connections", "peer_port", "pid", "--no-table-headers", "--quiet")
        found: dict[int, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit():
                # A connection's Erlang pid names its node: <rabbit@host.1234.5>.
                match = re.match(r"<(.+@[^.]+)\.", parts[1])
                if match:
                    found[int(parts[0])] = match.group(1)
        return found

    def destroy(self) -> None:
        """Kill every node (they are thrown away: a clean stop of a cluster takes long) and
        remove its folder."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda n: n.kill(), self.nodes))
        for node in self.nodes:
            node.destroy()


def remove_strays(prefix: str = PREFIX) -> list[str]:
    """Kill the Erlang VMs of nodes named `<prefix>-...` that an earlier, killed run left behind
    and remove their folders; return the node names found. The shared broker (another node
    name) is never touched."""
    found: list[str] = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            # Only the VMs: epmd, which a node may have started, serves the shared broker too.
            if (environ.parent / "comm").read_text().strip() != "beam.smp":
                continue
            names = [v for v in environ.read_bytes().split(b"\0")
                     if v.startswith(f"RABBITMQ_NODENAME={prefix}-".encode())]
            if names:
                found.append(names[0].split(b"=", 1)[1].decode())
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(environ.parent.name), signal.SIGKILL)
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(set(found))


def local_tcp_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets a process holds (from /proc: its fds and net/tcp)."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        with contextlib.suppress(OSError):
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            if match:
                inodes.add(match.group(1))
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def nodes_of(cluster: RabbitCluster, pid: int) -> set[str]:
    """The cluster nodes a process has AMQP connections to right now."""
    ports = local_tcp_ports(pid)
    by_port = cluster.connections_by_port(cluster.running()[0])
    return {node for port, node in by_port.items() if port in ports}
