"""A TCP proxy between the stack and one worker (it advertises the proxy's port): it passes bytes both ways, adds a
delay to each read when asked, and on `drop()` resets every connection it carries (and refuses new ones for a
while), as a failing link or a dying host would. The harness runs it in a process of its own (ProxyProcess).

Bytes only: it never parses what it carries.
"""

import asyncio
import contextlib
import logging
import multiprocessing
import socket
import struct
import time

from services.common.process import exit_with_parent

log = logging.getLogger(__name__)
REPLY_TIMEOUT_S = 10.0


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


class ProxyProcess:
    """A FaultyProxy in a process of its own, driven over a pipe: the load's clients share the caller's interpreter
    (and its GIL), and a proxy there would slow the bytes it carries, so the link would look faulty when it is not."""

    def __init__(self, target_host: str, target_port: int, port: int = 0):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_main, args=(child, target_host, target_port, port), daemon=True, name=f"chaos-proxy-{port}"
        )
        self._delay_s = 0.0
        self.port = port

    def start(self) -> int:
        self._proc.start()
        self.port = self._ask("port")
        return self.port

    def stop(self) -> None:
        if self._proc.is_alive():
            self._ask("stop")
        self._proc.join(timeout=5)

    @property
    def delay_s(self) -> float:
        return self._delay_s

    @delay_s.setter
    def delay_s(self, value: float) -> None:
        self._delay_s = value
        self._ask("delay", value)

    def drop(self, refuse_s: float = 0.0) -> int:
        """As FaultyProxy.drop, in the proxy's process."""
        return self._ask("drop", refuse_s)

    def _ask(self, op: str, arg=None):
        self._conn.send((op, arg))
        if not self._conn.poll(REPLY_TIMEOUT_S):
            raise TimeoutError(f"the proxy process did not answer {op!r} within {REPLY_TIMEOUT_S} s")
        return self._conn.recv()


def _main(conn, target_host: str, target_port: int, port: int) -> None:
    exit_with_parent()  # never outlive the harness
    asyncio.run(_serve(conn, FaultyProxy(target_host, target_port, port=port)))


async def _serve(conn, proxy: FaultyProxy) -> None:
    await proxy.start()
    stopped = asyncio.Event()

    def on_command() -> None:
        op, arg = conn.recv()
        if op == "port":
            conn.send(proxy.port)
        elif op == "delay":
            proxy.delay_s = arg
            conn.send(None)
        elif op == "drop":
            conn.send(proxy.drop(arg))
        elif op == "stop":
            stopped.set()

    asyncio.get_running_loop().add_reader(conn.fileno(), on_command)
    await stopped.wait()
    await proxy.stop()
    conn.send(None)
