"""G2: host memory for KV blocks, one slot per block with every layer contiguous, allocated in chunks. On a CUDA
host each chunk is plain malloc'd memory pinned with cudaHostRegister (the torch caching allocator would round a
large pinned request up to a power of two, and one huge pin stalls the driver); on a CPU host it is a plain
buffer pool. Slots only: which block sits in which slot is the core's (engines/core/tiers/kv_tiers.py)."""

import logging

import torch

from engines.base.errors import EngineUnavailableError

log = logging.getLogger(__name__)
CHUNK_BYTES = 1 << 30  # one allocation (and one registration) per GiB
GB = 1e9


def memory_available() -> int:
    """Bytes this machine can still give (MemAvailable), 0 when it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_host_budget(num_bytes: int, available: int) -> None:
    """Refuse at start a host tier this machine cannot hold (pinned memory is never swapped)."""
    if available and num_bytes > available:
        raise EngineUnavailableError(
            f"the host KV tier asks for {num_bytes / GB:.1f} GB but only {available / GB:.1f} GB of memory is "
            "available to pin; lower TANDEM_WORKER_KV_HOST_GB (--kv-host-gb)"
        )


class HostPool:
    def __init__(self, num_slots: int, slot_bytes: int, pin: bool = False):
        """`num_slots` slots of `slot_bytes` bytes each; `pin`: register them with CUDA (page-locked)."""
        self.num_slots, self.slot_bytes = num_slots, slot_bytes
        self.slots_per_chunk = max(1, CHUNK_BYTES // slot_bytes)
        self.chunks: list[torch.Tensor] = []  # each [slots, slot_bytes] uint8
        self._registered: list[int] = []
        try:
            for first in range(0, num_slots, self.slots_per_chunk):
                n = min(self.slots_per_chunk, num_slots - first)
                # NOTE: torch.empty on the CPU allocator (not pin_memory=True): the caching host allocator rounds up
                self.chunks.append(torch.empty(n, slot_bytes, dtype=torch.uint8))
                if pin:
                    self._pin(self.chunks[-1])
        except (RuntimeError, MemoryError) as exc:
            self.close()
            raise EngineUnavailableError(
                f"cannot allocate the host KV tier ({num_slots * slot_bytes / GB:.1f} "
                f"GB): {exc}; lower TANDEM_WORKER_KV_HOST_GB"
            ) from None

    @property
    def num_bytes(self) -> int:
        return self.num_slots * self.slot_bytes

    def locate(self, slot: int) -> tuple[int, int]:
        """(chunk index, row in the chunk) of a slot."""
        return divmod(slot, self.slots_per_chunk)

    def by_chunk(self, slots: list[int]) -> dict[int, tuple[list[int], list[int]]]:
        """Positions in `slots` and rows in each chunk, grouped by chunk (one copy per chunk)."""
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for pos, slot in enumerate(slots):
            chunk, row = self.locate(slot)
            positions, rows = groups.setdefault(chunk, ([], []))
            positions.append(pos)
            rows.append(row)
        return groups

    def slot(self, slot: int) -> torch.Tensor:
        chunk, row = self.locate(slot)
        return self.chunks[chunk][row]

    def close(self) -> None:
        if self._registered:
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)
            self._registered = []
        self.chunks = []

    def _pin(self, chunk: torch.Tensor) -> None:
        ptr = chunk.data_ptr()
        err = torch.cuda.cudart().cudaHostRegister(ptr, chunk.numel(), 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed with CUDA error {int(err)}")
        self._registered.append(ptr)
