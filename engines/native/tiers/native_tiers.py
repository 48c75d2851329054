"""The native runner's KV tiers: device blocks written through to host slots, host slots written to disk, and
onboarding loads (host or disk -> device blocks) run off the step loop — on a thread on CPU; on CUDA that thread
enqueues the copies on a copy stream and waits on its event, so the step loop never does. The core decides what
moves where (engines/core/tiers/kv_tiers.py); this moves bytes and measures how fast."""

import hashlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from engines.base.events import KvTier
from engines.core.loads import KvLoad, LoadDone
from engines.core.tiers.kv_tiers import DiskWrite, Onboard, OnboardBlock, TierReport, TierSpec
from engines.native.kv_cache import FP8_MAX, KvCache
from engines.native.tiers.disk_format import BlockHeader, BlockIdentity, CorruptBlockError
from engines.native.tiers.disk_store import DiskStore
from engines.native.tiers.host_pool import HostPool

log = logging.getLogger(__name__)
EWMA = 0.3  # weight of the newest measurement in a bandwidth estimate
_SAMPLE = 1 << 16  # bytes read from each part of a weight file for the fingerprint


def model_fingerprint(model_dir: str | Path) -> str:
    """Names a checkpoint's weights without reading them all: config.json, and each weight file's name, size
    and three 64 KiB samples (its header, middle and end)."""
    root = Path(model_dir)
    digest = hashlib.sha256((root / "config.json").read_bytes() if (root / "config.json").is_file() else b"")
    for path in sorted(root.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            for offset in (0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)):
                f.seek(offset)
                digest.update(f.read(_SAMPLE))
    return digest.hexdigest()[:32]


class NativeTiers:
    def __init__(self, kv_cache: KvCache, spec: TierSpec, disk_dir: str, model_id: str, disk_key: bytes = b""):
        self.kv, self.spec = kv_cache, spec
        layout = kv_cache.layout
        self.device = kv_cache.tensor.device
        self.kv8 = kv_cache.tensor.view(torch.uint8)  # [layers, 2, blocks, bs, heads, head_dim * itemsize]
        self.block_shape = (layout.num_layers, 2, *self.kv8.shape[3:])  # one block, every layer
        self.host = HostPool(spec.num_host_blocks, spec.block_bytes, pin=self.device.type == "cuda")
        identity = BlockIdentity(
            model_id, layout.dtype, layout.block_size, (layout.num_layers, layout.num_kv_heads, layout.head_dim)
        )
        self.disk = DiskStore(disk_dir, identity, disk_key) if spec.num_disk_blocks else None
        self._num_refused_reported = 0
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._offloaded = None  # CUDA: the event of the last write-through, which a disk write waits for
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-onboard")
        self._loads: dict[str, Future] = {}
        self._corrupt: list[int] = []
        self._lock = threading.Lock()
        self.bytes_per_s = {KvTier.HOST: 0.0, KvTier.DISK: 0.0}  # measured by loads; 0 until one ran
        self.prefill_tokens_per_s = 0.0  # no prior: the core measures it

    @property
    def tier_spec(self) -> TierSpec:
        return self.spec

    # -- write-through and disk ---------------------------------------------------------------
    def offload(self, copies: list[tuple[int, int]]) -> None:
        """Device block -> host slot, each a whole block. Called between steps: on CPU the copy is done when
        this returns; on CUDA it is enqueued after the step that computed the blocks and before the next."""
        if not copies:
            return
        if self.copy_stream is None:
            for block_id, slot in copies:
                self.host.slot(slot).view(self.block_shape).copy_(self.kv8[:, :, block_id])
            return
        ids = torch.tensor([b for b, _ in copies], device=self.device)
        staged = self.kv8.index_select(2, ids).permute(2, 0, 1, 3, 4, 5).contiguous()  # [n, layers, 2, ...]
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            for i, (_, slot) in enumerate(copies):
                self.host.slot(slot).view(self.block_shape).copy_(staged[i], non_blocking=True)
            staged.record_stream(self.copy_stream)
            self._offloaded = torch.cuda.Event()
            self._offloaded.record(self.copy_stream)

    def write_disk(self, writes: list[DiskWrite]) -> None:
        if self.disk is None:
            return
        scales = tuple(self.kv.scales.flatten().tolist()) if self.kv.is_quantized else ()
        for w in writes:
            header = BlockHeader(
                self.disk.identity, w.block_hash, w.parent_hash, w.token_ids, scales, self.spec.block_bytes
            )
            self.disk.write(header, self._slot_bytes(w.host_slot, self._offloaded))

    def drop_disk(self, block_hashes: list[int]) -> None:
        if self.disk is not None and block_hashes:
            self.disk.delete(block_hashes)

    def restored_disk_blocks(self) -> list[tuple[int, int, tuple[int, ...]]]:
        return self.disk.scan() if self.disk is not None else []

    def poll_tiers(self) -> TierReport:
        with self._lock:
            corrupt, self._corrupt = self._corrupt, []
        if self.disk is None:
            return TierReport([], corrupt)
        refused, self._num_refused_reported = (
            self.disk.num_refused - self._num_refused_reported,
            self.disk.num_refused,
        )
        return TierReport(self.disk.poll(), corrupt, refused)

    # -- onboarding --------------------------------------------------------------------------
    def start_load(self, load: KvLoad) -> None:
        self._loads[load.req_id] = self._loader.submit(self._load, load.block_ids, load.source)

    def poll_loads(self) -> list[LoadDone]:
        done = [req_id for req_id, f in self._loads.items() if f.done()]
        results = []
        for req_id in done:
            exc = self._loads.pop(req_id).exception()
            results.append(LoadDone(req_id, exc is None, "" if exc is None else f"{type(exc).__name__}: {exc}"))
        return results

    def close(self) -> None:
        self._loader.shutdown(wait=True)
        if self.disk is not None:
            self.disk.close()
        self.host.close()

    def _load(self, block_ids: tuple[int, ...], source: Onboard) -> None:
        """On the loader thread: host blocks, then disk blocks, each tier timed for its bandwidth."""
        for tier in (KvTier.HOST, KvTier.DISK):
            pairs = [(b, s) for b, s in zip(block_ids, source.blocks) if s.tier is tier]
            if pairs:
                start = time.perf_counter()
                self._load_tier(tier, pairs)
                self._measured(tier, len(pairs) * self.spec.block_bytes, time.perf_counter() - start)

    def _load_tier(self, tier: KvTier, pairs: list[tuple[int, OnboardBlock]]) -> None:
        blocks = [self._host_block(s) if tier is KvTier.HOST else self._disk_block(s) for _, s in pairs]
        if self.copy_stream is None:
            for (block_id, _), block in zip(pairs, blocks):
                self.kv8[:, :, block_id].copy_(block)
            return
        with torch.cuda.stream(self.copy_stream):
            for (block_id, _), block in zip(pairs, blocks):
                self.kv8[:, :, block_id].copy_(block.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self.copy_stream)
        event.synchronize()  # NOTE: this thread waits; the step loop polls the future

    def _host_block(self, s: OnboardBlock) -> torch.Tensor:
        return self.host.slot(s.slot).view(self.block_shape)

    def _disk_block(self, s: OnboardBlock) -> torch.Tensor:
        try:
            payload, scales = self.disk.read(s.block_hash, s.parent_hash, s.token_ids)
        except CorruptBlockError:
            with self._lock:
                self._corrupt.append(s.block_hash)
            raise
        block = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.block_shape)
        return self._requantized(block, scales) if self.kv.is_quantized else block

    def _requantized(self, block: torch.Tensor, scales: tuple[float, ...]) -> torch.Tensor:
        """An FP8 block written with other scales, brought to this cache's (as an import is)."""
        ours = self.kv.scales.cpu()
        theirs = torch.tensor(scales, dtype=torch.float32).view(-1, 2) if scales else ours
        if torch.equal(theirs, ours):
            return block
        values = block.view(self.kv.dtype).float() * (theirs / ours).view(-1, 2, 1, 1, 1)
        return values.clamp(-FP8_MAX, FP8_MAX).to(self.kv.dtype).view(torch.uint8)

    def _slot_bytes(self, slot: int, after: "torch.cuda.Event | None"):
        def read() -> memoryview:
            if after is not None:
                after.synchronize()
            return memoryview(self.host.slot(slot).numpy())

        return read

    def _measured(self, tier: KvTier, num_bytes: int, seconds: float) -> None:
        if seconds > 0:
            rate, old = num_bytes / seconds, self.bytes_per_s[tier]
            self.bytes_per_s[tier] = rate if old == 0 else (1 - EWMA) * old + EWMA * rate
