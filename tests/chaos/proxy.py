"""A small asyncio TCP proxy that a test controls: forward, cut (reset every connection and
refuse new ones), restore. It stands between the relay and a server to simulate a network cut.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target host and port until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.cut_active = False
        self.connections_accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        """Listen on a free port (self.port)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_active:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _reset(writer)
            return
        self.connections_accepted += 1
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            self._writers.discard(w)
            _reset(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not self.cut_active:
                data = await reader.read(65536)
                if not data:
                    return
                writer.write(data)
                await writer.drain()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until restore()."""
        self.cut_active = True
        for w in list(self._writers):
            _reset(w)
        self._writers.clear()

    def restore(self) -> None:
        """Accept and forward connections again."""
        self.cut_active = False

    async def close(self) -> None:
        """Stop listening and drop everything."""
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
        for task in list(self._tasks):
            task.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    # abort() drops the socket at once (no graceful FIN handshake), like a broken link.
    with contextlib.suppress(Exception):
        writer.transport.abort()
