"""G3 on a local filesystem: one file per block, sharded by block hash (DIR/ab/abcd....kvb), written whole then
renamed into place by one writer thread, read and checked by the loader, re-indexed at start-up (a warm restart).
The directory is this worker's alone (0700, locked while it runs; files 0600) and every header is authenticated
with the deployment key bound to it: a planted or foreign file is refused, removed and counted. A full or
unwritable disk stops writes with one warning and serving goes on. The I/O shell only: which blocks live here is
the core's (engines/core/tiers/kv_tiers.py)."""

import fcntl
import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from engines.native.tiers.disk_format import (
    MAC_BYTES,
    PREFIX_BYTES,
    BlockHeader,
    BlockIdentity,
    BlockSeal,
    CorruptBlockError,
    ForeignBlockError,
    decode,
    encode,
    header_length,
    parse_header,
)

log = logging.getLogger(__name__)
SUFFIX = ".kvb"
_STOP = object()

Restored = tuple[int, int, tuple[int, ...]]  # (hash, parent hash, tokens), what the core indexes


class DirectoryInUseError(RuntimeError):
    """Another live worker holds this disk tier's directory: each worker needs its own."""


class DiskStore:
    def __init__(self, root: str | Path, identity: BlockIdentity, key: bytes | None = None):
        self.root, self.identity = Path(root), identity
        self.is_writable = True
        self.num_bytes_written = 0
        self.num_refused = 0  # files refused: planted, foreign, tampered or corrupt
        self._acks: list[tuple[int, bool]] = []  # (hash, ok) of writes since the last poll
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._lock_fd = -1
        try:
            self._own_directory()
        except OSError as exc:
            self._stop_writes(exc)
        self.seal = BlockSeal(key, os.fsencode(os.path.realpath(self.root)))
        self._thread = threading.Thread(target=self._work, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def _own_directory(self) -> None:
        """0700, owned by this process's user, locked by it; DirectoryInUseError when another process holds it."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.root.stat().st_uid != os.getuid():
            raise PermissionError(f"{self.root} belongs to another user")
        os.chmod(self.root, 0o700)  # NOTE: an older directory made with the umask's mode is tightened
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:  # NOTE: a POSIX record lock: held per process (its engine's stores may reopen it), freed when it dies
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            os.close(fd)
            raise DirectoryInUseError(
                f"the KV disk directory {self.root} is in use by another worker: give each worker its own --kv-disk-dir"
            ) from None
        self._lock_fd = fd

    def path(self, block_hash: int) -> Path:
        name = f"{block_hash:016x}"
        return self.root / name[:2] / (name + SUFFIX)

    # -- start-up ----------------------------------------------------------------------------
    def scan(self) -> list[Restored]:
        """Every readable block of this identity, oldest first. Files of another identity are left alone and
        never read; unparseable ones and leftovers of an interrupted write are removed."""
        found = []
        for path in self.root.glob(f"??/*{SUFFIX}*"):
            if path.suffix != SUFFIX:  # a temporary file a crash left behind
                _unlink(path)
                continue
            try:
                header, mtime = self._read_header(path), path.stat().st_mtime
            except CorruptBlockError as exc:
                log.warning("KV disk tier: refusing and removing %s: %s", path, exc)
                self._refused()
                _unlink(path)
                continue
            except (ForeignBlockError, OSError):
                continue
            if header.identity == self.identity and path.name == f"{header.block_hash:016x}{SUFFIX}":
                found.append((mtime, header))
        found.sort(key=lambda item: item[0])
        return [(h.block_hash, h.parent_hash, h.token_ids) for _, h in found]

    def _read_header(self, path: Path) -> BlockHeader:
        with open(path, "rb") as f:
            prefix = f.read(PREFIX_BYTES)
            raw = f.read(header_length(prefix))
            return parse_header(prefix, raw, f.read(MAC_BYTES), self.seal)[0]

    # -- reads (the loader's thread) ---------------------------------------------------------
    def read(self, block_hash: int, parent_hash: int, token_ids: tuple[int, ...]) -> tuple[memoryview, tuple]:
        """The block's payload and scales; CorruptBlockError (the file is removed) when it is not exactly the
        block asked for, intact."""
        path = self.path(block_hash)
        try:
            header, payload = decode(path.read_bytes(), self.identity, self.seal)
        except (CorruptBlockError, ForeignBlockError, OSError) as exc:
            self._refused()
            _unlink(path)
            raise CorruptBlockError(f"disk block {block_hash:016x}: {exc}") from None
        if (header.block_hash, header.parent_hash, header.token_ids) != (block_hash, parent_hash, token_ids):
            self._refused()
            _unlink(path)
            raise CorruptBlockError(f"disk block {block_hash:016x} holds another block")
        return payload, header.scales

    # -- writes (the writer thread) ----------------------------------------------------------
    def write(self, header: BlockHeader, payload: Callable[[], bytes | memoryview]) -> None:
        """Queue a block's write; `payload()` is called on the writer thread (its source stays valid until the
        write is acknowledged by `poll`)."""
        self._jobs.put((header, payload))

    def delete(self, block_hashes: list[int]) -> None:
        self._jobs.put(list(block_hashes))

    def poll(self) -> list[tuple[int, bool]]:
        with self._lock:
            acks, self._acks = self._acks, []
        return acks

    def flush(self) -> None:
        """Until every queued job is done (tests, shutdown)."""
        self._jobs.join()

    def close(self) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout=10)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # NOTE: releases the directory's lock
            self._lock_fd = -1

    def _refused(self) -> None:
        with self._lock:
            self.num_refused += 1

    def _work(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            try:
                if isinstance(job, list):
                    for block_hash in job:
                        _unlink(self.path(block_hash))
                else:
                    self._ack(job[0].block_hash, self._write_one(*job))
            except Exception:  # NOTE: a bug here must not kill the thread and leave pins forever
                log.exception("KV disk tier: writer failed")
                if not isinstance(job, list):
                    self._ack(job[0].block_hash, False)
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _write_one(self, header: BlockHeader, payload: Callable[[], bytes | memoryview]) -> bool:
        if not self.is_writable:
            return False
        path = self.path(header.block_hash)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            parts = encode(header, payload(), self.seal)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                written = os.writev(fd, parts)
            finally:
                os.close(fd)
            if written != sum(len(p) for p in parts):
                raise OSError(f"short write ({written} bytes)")
            os.replace(tmp, path)
        except OSError as exc:
            _unlink(tmp)
            self._stop_writes(exc)
            return False
        self.num_bytes_written += written
        return True

    def _ack(self, block_hash: int, ok: bool) -> None:
        with self._lock:
            self._acks.append((block_hash, ok))

    def _stop_writes(self, exc: OSError) -> None:
        if self.is_writable:
            log.warning(
                "KV disk tier: cannot write to %s (%s); no more blocks go to disk, serving goes on", self.root, exc
            )
        self.is_writable = False


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
