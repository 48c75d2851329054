"""KV tiers that move no bytes, for runners that hold no real KV (sim, zero): the core's tier accounting runs as
it does over real tiers; an onboarding load ends after its bytes / the tier's bandwidth on the clock it is given
(virtual in the cluster simulator), and writes to disk succeed at once. No torch, no I/O."""

import math
import time
from collections.abc import Callable

from engines.base.events import KvTier
from engines.core.loads import KvLoad, LoadDone
from engines.core.tiers.kv_tiers import DiskWrite, Onboard, TierReport, TierSpec


class ModelledTiers:
    def __init__(
        self,
        spec: TierSpec,
        host_bytes_per_s: float = math.inf,
        disk_bytes_per_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
        time_factor: float = 1.0,
        prefill_tokens_per_s: float = 0.0,
    ):
        self.tier_spec = spec
        self.bytes_per_s = {KvTier.HOST: host_bytes_per_s, KvTier.DISK: disk_bytes_per_s}
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.clock, self.time_factor = clock, time_factor
        self._due: dict[str, float] = {}  # load id -> when it ends
        self._acks: list[tuple[int, bool]] = []

    def load_seconds(self, source: Onboard) -> float:
        """Each block's bytes over its tier's bandwidth."""
        return sum(self.tier_spec.block_bytes / self.bytes_per_s[b.tier] for b in source.blocks)

    def start_load(self, load: KvLoad) -> None:
        assert isinstance(load.source, Onboard)  # NOTE: the only loads a modelled tier runs
        self._due[load.req_id] = self.clock() + self.load_seconds(load.source) * self.time_factor

    def poll_loads(self) -> list[LoadDone]:
        now = self.clock()
        done = [req_id for req_id, due in self._due.items() if due <= now]
        for req_id in done:
            del self._due[req_id]
        return [LoadDone(req_id, True) for req_id in done]

    def next_due(self) -> float | None:
        """When the next load in flight ends (None: none is)."""
        return min(self._due.values(), default=None)

    def offload(self, copies: list[tuple[int, int]]) -> None:
        pass  # NOTE: asynchronous on a real engine, and nothing to copy here

    def write_disk(self, writes: list[DiskWrite]) -> None:
        self._acks += [(w.block_hash, True) for w in writes]

    def drop_disk(self, block_hashes: list[int]) -> None:
        pass

    def poll_tiers(self) -> TierReport:
        acks, self._acks = self._acks, []
        return TierReport(acks)

    def restored_disk_blocks(self) -> list[tuple[int, int, tuple[int, ...]]]:
        return []  # NOTE: a modelled disk does not outlive its process
