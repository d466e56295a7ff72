"""A TCP proxy a test can cut and restore, to take a server away from one relay only.

The shared servers stay up for everyone else: the relay under test talks to the proxy's port,
and `cut()` closes the listening socket and every open connection through it; `restore()`
listens on the same port again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target host and port, until cut."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        port: int | None = None,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.target_host = target_host
        self.tls = tls  # terminate TLS on the proxy's side (clients speak TLS, target plain)
        self.target_port = target_port
        self.port = port or free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections_made = 0

    async def start(self) -> TcpProxy:
        """Listen (again) on the proxy's port."""
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, ssl=self.tls
        )
        return self

    async def restore(self) -> None:
        """Listen again after a cut."""
        if self._server is None:
            await self.start()

    async def cut(self) -> None:
        """Stop listening and drop every open connection at once."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        self._pipes.clear()
        self._writers.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), timeout=2)

    async def close(self) -> None:
        """Cut for good."""
        await self.cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            writer.transport.abort()
            return
        self.connections_made += 1
        self._writers.update({writer, up_writer})
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: end both, as a real cut would.
            with contextlib.suppress(Exception):
                dst.transport.abort()
            self._writers.discard(dst)
