"""Staging files: a worker's preallocated shared-memory file the gRPC fallback receives KV into (decode) or
exports KV through (prefill), with a first-fit allocator over it; the engine process maps the same file by
path. Bytes only; no asyncio, no gRPC."""

import os
import tempfile
import threading

import numpy as np

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class StagingFile:
    """A file of `capacity` bytes in shared memory, mapped here; removed by `close`. Its name carries the owner's
    pid, so a file whose owner died without closing it (SIGKILL) is removed when the next one is made."""

    def __init__(self, capacity: int, prefix: str = "tandem-kv"):
        if capacity < 1:
            raise ValueError(f"staging capacity must be >= 1 byte, got {capacity}")
        remove_orphans()
        fd, self.path = tempfile.mkstemp(prefix=f"{prefix}-{os.getpid()}-", dir=SHM_DIR)
        os.close(fd)
        self.capacity = capacity
        self.array = np.memmap(self.path, dtype=np.uint8, mode="w+", shape=(capacity,))  # NOTE: pages on first use
        self.regions = RegionAllocator(capacity)

    def close(self) -> None:
        del self.array
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def owner_pid(name: str) -> int | None:
    """The pid in a staging file's name (tandem-kv-<role>-<pid>-<random>), or None for another name."""
    parts = name.split("-")
    if len(parts) < 5 or parts[:2] != ["tandem", "kv"] or not parts[-2].isdigit():
        return None
    return int(parts[-2])


def remove_orphans(directory: str = SHM_DIR) -> list[str]:
    """Remove the staging files whose owner process is gone; the names removed."""
    removed = []
    for name in os.listdir(directory):
        pid = owner_pid(name)
        if pid is not None and not _alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except FileNotFoundError:  # NOTE: another process removed it first
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


class RegionAllocator:
    """First-fit over [0, capacity); thread-safe. `alloc` returns an offset or None when no gap fits."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._used: dict[int, int] = {}  # offset -> size
        self._lock = threading.Lock()

    @property
    def num_used_bytes(self) -> int:
        return sum(self._used.values())

    def alloc(self, size: int) -> int | None:
        with self._lock:
            start = 0
            for offset in sorted(self._used):
                if offset - start >= size:
                    break
                start = offset + self._used[offset]
            if start + size > self.capacity:
                return None
            self._used[start] = size
            return start

    def free(self, offset: int) -> None:
        with self._lock:
            self._used.pop(offset, None)


class StagingReader:
    """The engine process's side: staging files mapped by path, read-only, kept open."""

    def __init__(self):
        self._maps: dict[str, np.memmap] = {}

    def array(self, path: str) -> np.ndarray:
        mapped = self._maps.get(path)
        if mapped is None:
            mapped = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r+")
        return mapped
