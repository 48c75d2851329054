"""Which IPC carries the engine process's messages: multiprocessing pipes (pickle), ZMQ (msgpack or pickle),
or a shared-memory ring (msgpack, an eventfd to wake the reader). Prints a table, writes JSON.

    .venv/bin/python bench/ipc_bench.py --json bench/out/ipc.json

Two measurements per candidate, both with the reader on an asyncio loop as the worker's gRPC process runs it:
- round trip: the front sends a small command, the engine process answers at once (an add's fixed cost);
- step stream: the engine process sends one message per step with `batch` requests' new tokens (the shape of
  the engine loop's batched output), the front decodes each into per-request tuples: first paced at one step
  per millisecond (delivery latency, "lag"), then flat out (steps and tokens per second).
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import pickle
import platform
import struct
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path

import msgpack
import zmq
import zmq.asyncio

CANDIDATES = ("pipe+pickle", "pipe+msgpack", "zmq+msgpack", "zmq+pickle", "shm+msgpack")
_RING_BYTES = 1 << 22
PACED_STEP_S = 0.001
_HEAD = struct.Struct("<QQ")  # bytes written, bytes read: the ring's two cursors, each owned by one side


def step_message(step: int, batch: int) -> list:
    """One step's output: (req_id, new token ids, finish reason, cached tokens) per request, plus stats."""
    outputs = [[f"req-{i:06d}", [(step * 7919 + i) % 32000], None, 0] for i in range(batch)]
    return [time.perf_counter(), outputs, [batch, 0, 0, 4096, 512, 0, 16, 8192, 0, 0, 0, step * 128, step]]


# -- shared-memory ring: one writer, one reader; length-prefixed records; an eventfd says "more" ----------------
class Ring:
    def __init__(self, name: str | None = None):
        self.shm = shared_memory.SharedMemory(name=name, create=name is None, size=_RING_BYTES + _HEAD.size)
        self.buf = self.shm.buf
        self.size = _RING_BYTES

    def _cursors(self) -> tuple[int, int]:
        return _HEAD.unpack_from(self.buf, 0)

    def write(self, payload: bytes) -> None:
        record = struct.pack("<I", len(payload)) + payload
        while True:
            written, read = self._cursors()
            if written - read + len(record) <= self.size:
                break
            time.sleep(0)  # full: the reader is behind
        for i, byte_chunk in self._spans(written, record):
            self.buf[_HEAD.size + i : _HEAD.size + i + len(byte_chunk)] = byte_chunk
        struct.pack_into("<Q", self.buf, 0, written + len(record))

    def read_all(self) -> list[bytes]:
        written, read = self._cursors()
        records = []
        while read < written:
            (n,) = struct.unpack("<I", self._take(read, 4))
            records.append(self._take(read + 4, n))
            read += 4 + n
        struct.pack_into("<Q", self.buf, 8, read)
        return records

    def _spans(self, at: int, data: bytes):
        start = at % self.size
        first = min(len(data), self.size - start)
        yield start, data[:first]
        if first < len(data):
            yield 0, data[first:]

    def _take(self, at: int, n: int) -> bytes:
        start = at % self.size
        first = min(n, self.size - start)
        data = bytes(self.buf[_HEAD.size + start : _HEAD.size + start + first])
        return data + bytes(self.buf[_HEAD.size : _HEAD.size + n - first]) if first < n else data

    def close(self, unlink: bool = False) -> None:
        self.buf.release()
        self.shm.close()
        if unlink:
            self.shm.unlink()


# -- the engine side (a spawned child) ----------------------------------------------------------------------------
def engine_side(kind: str, address, num_steps: int, batch: int, num_pings: int) -> None:
    send, recv, close = _engine_endpoints(kind, address)
    for _ in range(num_pings):
        send(recv())
    for step in range(num_steps):  # paced as a 1 ms device step would pace it: the delivery latency
        send(step_message(step, batch))
        deadline = time.perf_counter() + PACED_STEP_S
        while time.perf_counter() < deadline:
            pass
    send(None)
    for step in range(num_steps):  # flat out: the most steps per second the front can take
        send(step_message(step, batch))
    send(None)
    recv()  # the front's goodbye: keep the channel open until everything is read
    close()


def _engine_endpoints(kind: str, address):
    if kind == "pipe+pickle":
        conn = address
        return conn.send, conn.recv, conn.close
    if kind == "pipe+msgpack":
        conn = address
        return (lambda m: conn.send_bytes(msgpack.packb(m))), (lambda: msgpack.unpackb(conn.recv_bytes())), conn.close
    if kind.startswith("zmq"):
        ctx = zmq.Context()
        push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
        push.connect(address[0])
        pull.connect(address[1])
        dumps, loads = (msgpack.packb, msgpack.unpackb) if kind == "zmq+msgpack" else (pickle.dumps, pickle.loads)
        return (lambda m: push.send(dumps(m), copy=False)), (lambda: loads(pull.recv())), (lambda: ctx.destroy(0))
    ring_name, to_front_fd, cmd_conn = address
    ring = Ring(ring_name)

    def send(message) -> None:
        ring.write(msgpack.packb(message))
        os.eventfd_write(to_front_fd, 1)

    return send, cmd_conn.recv, (lambda: (ring.close(), cmd_conn.close()))


# -- the front side (the asyncio process) -------------------------------------------------------------------------
class Front:
    """Start the engine side, then ping (round trips) and drain the step stream, on one asyncio loop."""

    def __init__(self, kind: str, num_steps: int, batch: int, num_pings: int):
        self.kind, self.num_steps, self.batch, self.num_pings = kind, num_steps, batch, num_pings
        self.inbox: asyncio.Queue = asyncio.Queue()

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        child_args, send, cleanup = self._open(loop)
        method = "fork" if self.kind == "shm+msgpack" else "spawn"  # NOTE: the shm child inherits the eventfd
        proc = mp.get_context(method).Process(
            target=engine_side, args=(self.kind, child_args, self.num_steps, self.batch, self.num_pings)
        )
        proc.start()
        try:
            rtts = []
            for i in range(self.num_pings):
                start = time.perf_counter()
                send(["abort", f"req-{i}"])
                await self.inbox.get()
                rtts.append(time.perf_counter() - start)
            lags = []
            while (message := await self.inbox.get()) is not None:
                self._decode(message)
                lags.append(time.perf_counter() - message[0])
            start, count = time.perf_counter(), 0
            while (message := await self.inbox.get()) is not None:
                count += self._decode(message)
            elapsed = time.perf_counter() - start
            send(["bye"])
            proc.join(10)
        finally:
            cleanup()
            if proc.is_alive():
                proc.kill()
        rtts.sort()
        lags.sort()
        return {
            "rtt_p50_us": rtts[len(rtts) // 2] * 1e6,
            "rtt_p99_us": rtts[int(len(rtts) * 0.99)] * 1e6,
            "steps_per_s": self.num_steps / elapsed,
            "tokens_per_s": count / elapsed,
            "lag_p50_us": lags[len(lags) // 2] * 1e6,
        }

    @staticmethod
    def _decode(message) -> int:
        _, outputs, _ = message
        per_request = [(o[0], tuple(o[1]), o[2]) for o in outputs]  # what the client hands to the streams
        return len(per_request)

    def _open(self, loop):
        if self.kind.startswith("pipe"):
            front, engine = mp.Pipe()
            loop.add_reader(front.fileno(), lambda: self._drain_pipe(front))
            send = front.send if self.kind == "pipe+pickle" else (lambda m: front.send_bytes(msgpack.packb(m)))
            return engine, send, lambda: (loop.remove_reader(front.fileno()), front.close())
        if self.kind.startswith("zmq"):
            return self._open_zmq()
        return self._open_shm(loop)

    def _drain_pipe(self, conn) -> None:
        while conn.poll():
            self.inbox.put_nowait(conn.recv() if self.kind == "pipe+pickle" else msgpack.unpackb(conn.recv_bytes()))

    def _open_zmq(self):
        ctx = zmq.asyncio.Context()
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        base = f"ipc:///tmp/tandem-ipc-bench-{os.getpid()}"
        pull.bind(f"{base}-out")
        push.bind(f"{base}-in")
        loads = msgpack.unpackb if self.kind == "zmq+msgpack" else pickle.loads
        dumps = msgpack.packb if self.kind == "zmq+msgpack" else pickle.dumps

        async def reader() -> None:
            while True:
                self.inbox.put_nowait(loads(await pull.recv(copy=False)))

        task = asyncio.ensure_future(reader())
        return ((f"{base}-out", f"{base}-in"), lambda m: push.send(dumps(m)), lambda: (task.cancel(), ctx.destroy(0)))

    def _open_shm(self, loop):
        ring = Ring()
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        front, engine = mp.Pipe()

        def on_wake() -> None:
            try:
                os.eventfd_read(wake)
            except BlockingIOError:
                return
            for record in ring.read_all():
                self.inbox.put_nowait(msgpack.unpackb(record))

        loop.add_reader(wake, on_wake)
        return (
            (ring.shm.name, wake, engine),
            front.send,
            lambda: (loop.remove_reader(wake), os.close(wake), ring.close(unlink=True)),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for batch in args.batch:
        for kind in args.candidates:
            result = asyncio.run(Front(kind, args.steps, batch, args.pings).run())
            rows.append({"candidate": kind, "batch": batch, **result})
            print(
                f"{kind:12s} batch {batch:4d}: rtt p50 {result['rtt_p50_us']:7.1f} us  p99 "
                f"{result['rtt_p99_us']:7.1f} us  steps/s {result['steps_per_s']:9.0f}  tokens/s "
                f"{result['tokens_per_s']:10.0f}  lag p50 {result['lag_p50_us']:9.1f} us",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"host": platform.node(), "load_avg": os.getloadavg(), "rows": rows}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
