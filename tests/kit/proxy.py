"""The one TCP proxy of the tests: it takes a server away from one relay only, loudly or
silently, while the shared servers stay up for everyone else.

The relay under test talks to the proxy's port. Three states:

- forwarding (after `start()` / `restore()`);
- cut (`cut()`): every open connection is reset and new ones are refused, as when a server
  or a link goes down and the peer's kernel says so;
- black hole (`black_hole()`): sockets stay open and nothing is forwarded, either way; the
  bytes sent are held, new connections are accepted and held too. Nothing tells either end:
  only keepalives, heartbeats and timeouts can notice. `restore()` resets the held
  connections (their peers gave up on them, or will) and forwards new ones.

`client_closes` records when a client closed a connection the black hole held: the moment the
relay gave up on it by itself. `hold_replies` swallows what the server sends while the clients'
bytes still go through (a broker whose confirms never come back); `bytes_up` counts what the
clients sent. `up_bytes_per_s` makes the link slow one way: what the relay
sends crawls (all its connections share the rate), the answers come back at full speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from tests.kit.ports import free_port


@dataclass(eq=False)  # identity hash: links live in a set
class _Link:
    """One client connection and, unless held from the start, its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    held_bytes: int = 0


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target host and port; can cut or black-hole it."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        port: int | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        up_bytes_per_s: float | None = None,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.tls = tls  # terminate TLS on the proxy's side (clients speak TLS, target plain)
        # A slow uplink: what clients send goes on at this rate, all connections sharing it
        # (a congested link); the answers come back at full speed. None: no limit.
        self.up_bytes_per_s = up_bytes_per_s
        self._uplink_free_at = time.monotonic()
        self.port = port or free_port()
        self.connections_made = 0
        self.black_holed_at: float | None = None
        self.client_closes: list[float] = []  # monotonic times a client closed a held link
        self.hold_replies = False
        self.bytes_up = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()

    async def start(self) -> TcpProxy:
        """Listen (again) on the proxy's port."""
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, ssl=self.tls
        )
        return self

    @property
    def holding(self) -> bool:
        """The proxy is a black hole right now."""
        return self.black_holed_at is not None

    def black_hole(self) -> None:
        """From now on forward nothing and close nothing; hold whatever arrives."""
        self.black_holed_at = time.monotonic()
        self.client_closes.clear()

    async def cut(self) -> None:
        """Reset every open connection and refuse new ones until restore()."""
        self.black_holed_at = None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._reset_all()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=2)

    async def restore(self) -> None:
        """Forward again: after a cut, listen again; after a black hole, reset the held
        connections (as their peers' timeouts would) and forward new ones."""
        if self.holding:
            self.black_holed_at = None
            await self._reset_all()
        if self._server is None:
            await self.start()

    async def reset(self) -> None:
        """Reset every open connection and forward new ones at once (a link that broke and
        came back)."""
        self.hold_replies = False
        await self.cut()
        await self.restore()

    async def close(self) -> None:
        """Cut for good."""
        await self.cut()

    async def _reset_all(self) -> None:
        links, self._links = list(self._links), set()
        for link in links:
            _reset(link.client)
            if link.upstream is not None:
                _reset(link.upstream)
            for task in link.tasks:
                task.cancel()
        await asyncio.gather(*(t for link in links for t in link.tasks), return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if not self.holding:
            try:
                upstream = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                _reset(writer)
                return
        self.connections_made += 1
        link = _Link(writer, upstream[1] if upstream else None)
        self._links.add(link)
        link.tasks.append(asyncio.ensure_future(self._pump(link, reader, link.upstream,
                                                           from_client=True)))
        if upstream is not None:
            link.tasks.append(asyncio.ensure_future(self._pump(link, upstream[0], writer,
                                                               from_client=False)))

    def _uplink_wait_s(self, size: int) -> float:
        """How long `size` client bytes wait for the shared slow uplink (no await between the
        read and the write of its clock, so connections take turns)."""
        assert self.up_bytes_per_s is not None
        now = time.monotonic()
        self._uplink_free_at = max(self._uplink_free_at, now) + size / self.up_bytes_per_s
        return self._uplink_free_at - now

    async def _pump(self, link: _Link, src: asyncio.StreamReader,
                    dst: asyncio.StreamWriter | None, *, from_client: bool) -> None:
        try:
            while data := await src.read(65536 if self.up_bytes_per_s is None else 16384):
                if self.holding or dst is None:
                    link.held_bytes += len(data)
                    continue
                if from_client:
                    self.bytes_up += len(data)
                elif self.hold_replies:
                    continue  # swallowed: the client never hears these
                if from_client and self.up_bytes_per_s is not None:
                    await asyncio.sleep(self._uplink_wait_s(len(data)))
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        if self.holding:
            # One end gave up on a connection the black hole holds: the other end hears
            # nothing (a silent cut). Note when the client (the relay) did.
            if from_client:
                self.client_closes.append(time.monotonic())
            return
        # One side ended while forwarding: end both, as a real cut would.
        for w in (link.client, link.upstream):
            if w is not None:
                _reset(w)
        self._links.discard(link)


def _reset(writer: asyncio.StreamWriter) -> None:
    # abort() drops the socket at once (no graceful FIN handshake), like a broken link.
    with contextlib.suppress(Exception):
        writer.transport.abort()


def via_proxy(url: str, port: int) -> str:
    """The same DSN or AMQP URL (user, password, database, query kept) through a local port."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


async def proxy_for(url: str) -> TcpProxy:
    """A started proxy to the server of a DSN or AMQP URL."""
    parts = urlsplit(url)
    return await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
