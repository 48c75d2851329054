"""A TCP proxy between the stack and one worker (it advertises the proxy's port): it passes bytes both ways, adds a
delay to each read when asked, and on `drop()` resets every connection it carries (and refuses new ones for a
while), as a failing link or a dying host would.

Bytes only: it never parses what it carries.
"""
import asyncio
import contextlib
import logging
import socket
import struct
import time

log = logging.getLogger(__name__)


class FaultyProxy:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0):
        self.target = (target_host, target_port)
        self.host, self.port = host, port
        self.delay_s = 0.0
        self.num_dropped = 0
        self._refuse_until = 0.0
        self._server: asyncio.AbstractServer | None = None
        self._links: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop(self, refuse_s: float = 0.0) -> int:
        """Reset every live connection (both sides see ECONNRESET); refuse new ones for `refuse_s`."""
        self._refuse_until = time.monotonic() + refuse_s
        links, self._links = list(self._links), set()
        for writer in links:
            _reset(writer)
        self.num_dropped += len(links) // 2
        return len(links) // 2

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            _reset(client_writer)
            return
        try:
            worker_reader, worker_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(client_writer)
            return
        self._links |= {client_writer, worker_writer}
        try:
            await asyncio.gather(self._pipe(client_reader, worker_writer), self._pipe(worker_reader, client_writer))
        finally:
            for writer in (client_writer, worker_writer):
                self._links.discard(writer)
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(1 << 16):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: the peer's next read fails at once, as when a host or a link dies."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
