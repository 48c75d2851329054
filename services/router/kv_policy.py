"""KV-aware routing: each worker's cost is the blocks it would still have to prefill (its queue plus this
prompt after its cached prefix) plus a weight times the blocks its in-flight requests hold; the lowest cost wins
(or a softmax draw over costs). Both loads are the router's own account of its routes, so they are never a
heartbeat stale.

Pure: no I/O, no transport; time and randomness are injected. Hashes come from engines/base/block_hash.py.
"""

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engines.base.block_hash import chain_block_hashes, num_blocks_for
from engines.base.events import KvTier
from services.router.prefix_index import CachedPrefix, PrefixIndex, walk
from services.router.types import Choice, RouteInput, WorkerLoad, WorkerView

Clock = Callable[[], float]
DEFAULT_TIER_WEIGHTS = {KvTier.DEVICE: 1.0, KvTier.HOST: 0.75, KvTier.DISK: 0.25}
_NOTHING = CachedPrefix(0)


class Rng(Protocol):
    def random(self) -> float: ...


class RecentRouteLog(Protocol):
    """What the policy needs of its own recent decisions (`ApproximateIndex`, or the array policy's table)."""

    def record(self, block_hashes: Sequence[int], worker_id: str) -> None: ...

    def overlap(self, block_hashes: Sequence[int]) -> dict[str, int]: ...

    def remove_worker(self, worker_id: str) -> None: ...


class ApproximateIndex:
    """The router's own recent decisions: a prompt's block hashes -> the worker it went to, for `ttl_s`.

    Stands in for KV events on engines without them, and covers sibling requests that arrive before the
    chosen worker's STORED event does.
    """

    def __init__(self, clock: Clock, ttl_s: float = 120.0, max_entries: int = 100_000):
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError(f"need ttl_s > 0 and max_entries >= 1, got {ttl_s} and {max_entries}")
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._until: OrderedDict[int, dict[str, float]] = OrderedDict()  # hash -> {worker_id: expires at}

    def __len__(self) -> int:
        return len(self._until)

    def record(self, block_hashes: Sequence[int], worker_id: str) -> None:
        until = self._clock() + self.ttl_s
        for block_hash in reversed(block_hashes):  # NOTE: parents last, so they outlive their children
            self._until.setdefault(block_hash, {})[worker_id] = until
            self._until.move_to_end(block_hash)
        self.expire()
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def overlap(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Per worker: the leading blocks routed to it within the TTL.

        NOTE: a prompt is recorded with all its ancestors, so along a chain a worker's expiry never grows with
        depth: walk presence alone (PrefixIndex's walk), then check each worker's deepest block, and
        binary-search its live prefix only when that one has lapsed.
        """
        entries = self._until
        ends, _ = walk(entries, block_hashes)
        now = self._clock()
        counts = {}
        for worker_id, n in ends.items():
            if entries[block_hashes[n - 1]][worker_id] > now:
                counts[worker_id] = n
                continue
            lo, hi = 0, n - 1  # the first lapsed block is in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if entries[block_hashes[mid]][worker_id] > now:
                    lo = mid + 1
                else:
                    hi = mid
            if lo:
                counts[worker_id] = lo
        return dict(sorted(counts.items()))

    def expire(self) -> None:
        """Drop hashes whose every decision has lapsed, oldest first (the front was touched longest ago)."""
        now = self._clock()
        while self._until and max(next(iter(self._until.values())).values()) <= now:
            self._until.popitem(last=False)

    def remove_worker(self, worker_id: str) -> None:
        for block_hash, until in list(self._until.items()):
            if until.pop(worker_id, None) is not None and not until:
                del self._until[block_hash]


@dataclass(frozen=True, slots=True)
class KvPolicyConfig:
    overlap_weight: float = 1.0  # blocks of prefill saved per cached block; 0 = ignore the cache
    # what a block held by an in-flight request costs against one to prefill (Dynamo's cost: 1.0): a decode step
    # reads it, but over a waiting request's few steps it costs far less than prefilling a block (bench/RESULTS.md)
    inflight_weight: float = 0.1
    temperature: float = 0.0  # 0 = argmin; > 0 = softmax over min-max-normalised costs
    block_size: int = 16  # when a worker's layout does not say
    use_events: bool = True  # False: the approximate index alone (engines without KV events)
    predict_ttl_s: float = 120.0  # how long the router trusts its own decisions
    # what a block cached in the host / disk tier counts for (a device block counts 1); None: what it saves
    # against recomputing on that worker (`tier_credit`), or the fixed default while the worker reports nothing
    host_weight: float | None = None
    disk_weight: float | None = None

    def __post_init__(self) -> None:
        if self.overlap_weight < 0 or self.inflight_weight < 0 or self.temperature < 0:
            raise ValueError("overlap_weight, inflight_weight and temperature must be >= 0")
        if any(w is not None and not 0 <= w <= 1 for w in (self.host_weight, self.disk_weight)):
            raise ValueError("host_weight and disk_weight must be in [0, 1]")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")


def tier_credit(load: WorkerLoad, tier: KvTier, default: float) -> float:
    """What a block cached in a lower tier of a worker saves against recomputing it, in device blocks:
    1 - (its load time / its recompute time), from the worker's measured bandwidth and prefill rate; `default`
    while it reports none. Loading slower than recomputing saves nothing (the worker then recomputes)."""
    bandwidth = load.kv_host_bytes_per_s if tier is KvTier.HOST else load.kv_disk_bytes_per_s
    if bandwidth <= 0 or load.prefill_tokens_per_s <= 0 or load.kv_bytes_per_token <= 0:
        return default
    return max(0.0, 1.0 - load.kv_bytes_per_token * load.prefill_tokens_per_s / bandwidth)


@dataclass(frozen=True, slots=True)
class KvScore:
    view: WorkerView
    num_overlap_blocks: int  # leading prompt blocks cached (the longer of events and own decisions)
    num_prompt_blocks: int
    cost: float

    def key(self) -> tuple[float, int, str]:
        # NOTE: a total order: equal costs go to fewer in-flight tokens, then the smaller worker_id
        return self.cost, self.view.num_inflight_tokens, self.view.worker_id


class KvAwarePolicy:
    """`prefill = max(queued + prompt_blocks - overlap_weight * Σ tier_weight(cached block), 0)`,
    `cost = prefill + inflight_weight * inflight`, in blocks. A host or disk block's tier weight is what it saves
    against recomputing on that worker (`tier_credit`), unless the config fixes it. `queued` is the uncached blocks
    of the worker's routes it has likely not prefilled yet (`WorkerView.num_queued_prefill_tokens`), `inflight` the
    blocks its routes not yet completed added (`WorkerView.num_inflight_tokens`: a prefix they share counts once, as
    Dynamo counts a worker's unique active blocks). With inflight_weight 1 this is Dynamo's cost; either way the loads are the router's own account, so a burst of siblings spreads before
    any event or heartbeat arrives, and a finished request stops counting at once."""

    name = "kv"

    def __init__(
        self,
        index: PrefixIndex,
        clock: Clock,
        rng: Rng | None = None,
        config: KvPolicyConfig = KvPolicyConfig(),
        tier_weights: dict[KvTier, float] | None = None,
    ):
        if config.temperature > 0 and rng is None:
            raise ValueError("temperature > 0 needs an rng")
        self.index = index
        self.config = config
        self.rng = rng
        self.tier_weights = tier_weights or DEFAULT_TIER_WEIGHTS
        self.predicted: RecentRouteLog = ApproximateIndex(clock, config.predict_ttl_s)

    @property
    def event_index(self) -> PrefixIndex | None:
        return self.index if self.config.use_events else None

    def choose(self, request: RouteInput, candidates: list[WorkerView]) -> Choice:
        scores, hashes = self._scores(request, candidates)
        chosen = self._pick(scores)
        block_size = self._block_size(chosen.view)
        self.predicted.record(hashes[block_size], chosen.view.worker_id)
        return Choice(chosen.view, chosen.num_overlap_blocks * block_size)

    def scores(self, request: RouteInput, candidates: list[WorkerView]) -> list[KvScore]:
        """Every candidate's cost, sorted best first (by `KvScore.key`)."""
        return self._scores(request, candidates)[0]

    def _scores(
        self, request: RouteInput, candidates: list[WorkerView]
    ) -> tuple[list[KvScore], dict[int, Sequence[int]]]:
        """The sorted scores, and the prompt's block hashes per block size (what `choose` records)."""
        matches: dict[int, tuple[Sequence[int], dict, dict]] = {}  # block_size -> hashes, event tiers, predicted
        num_tokens = len(request.token_ids)
        weights = self.tier_weights
        w_device, w_host, w_disk = weights[KvTier.DEVICE], weights[KvTier.HOST], weights[KvTier.DISK]
        overlap_weight, inflight_weight = self.config.overlap_weight, self.config.inflight_weight
        scores = []
        for view in candidates:  # NOTE: the hot loop of a Route among many workers: locals, no calls per worker
            block_size = self._block_size(view)
            match = matches.get(block_size)
            if match is None:
                match = matches[block_size] = self._match(request, block_size)
            worker_id = view.info.worker_id
            prefix = match[1].get(worker_id, _NOTHING)
            num_predicted = match[2].get(worker_id, 0)
            num_blocks, num_host, num_disk = prefix
            if num_host or num_disk:  # NOTE: rare in the hot loop: only workers with offloaded hits pay for it
                w_host, w_disk = self._tier_weights(view.load)
            cached = (num_blocks - num_host - num_disk) * w_device + num_host * w_host + num_disk * w_disk
            if num_predicted > num_blocks:  # NOTE: own decisions count as device blocks where events lag behind
                cached += num_predicted - num_blocks
            num_prompt = num_blocks_for(num_tokens, block_size)
            prefill = view.num_queued_prefill_tokens / block_size + num_prompt - overlap_weight * cached
            cost = (prefill if prefill > 0.0 else 0.0) + inflight_weight * view.num_inflight_tokens / block_size
            overlap = num_blocks if num_blocks > num_predicted else num_predicted
            scores.append(KvScore(view, overlap, num_prompt, cost))
        scores.sort(key=KvScore.key)
        return scores, {size: m[0] for size, m in matches.items()}

    def remove_worker(self, worker_id: str) -> None:
        self.index.remove_worker(worker_id)
        self.predicted.remove_worker(worker_id)

    # ---- internals ----

    def _tier_weights(self, load: WorkerLoad) -> tuple[float, float]:
        host, disk = self.config.host_weight, self.config.disk_weight
        return (
            host if host is not None else tier_credit(load, KvTier.HOST, self.tier_weights[KvTier.HOST]),
            disk if disk is not None else tier_credit(load, KvTier.DISK, self.tier_weights[KvTier.DISK]),
        )

    def _match(self, request: RouteInput, block_size: int) -> tuple[Sequence[int], dict, dict]:
        # NOTE: the gateway's hashes when it sent them for this block size (it tokenized the prompt already)
        hashes: Sequence[int]
        if request.block_hashes and request.hash_block_size == block_size:
            hashes = request.block_hashes
        else:
            hashes = chain_block_hashes(request.token_ids, block_size, request.hash_root)
        tiers = self.index.match(hashes) if self.config.use_events else {}
        return hashes, tiers, self.predicted.overlap(hashes)

    def _pick(self, scores: list[KvScore]) -> KvScore:
        if self.config.temperature == 0 or len(scores) == 1:
            return scores[0]
        low, high = scores[0].cost, scores[-1].cost
        span = (high - low) or 1.0
        weights = [math.exp(-((s.cost - low) / span) / self.config.temperature) for s in scores]
        assert self.rng is not None  # NOTE: the constructor refuses temperature > 0 without one
        draw = self.rng.random() * sum(weights)
        for score, weight in zip(scores, weights):
            draw -= weight
            if draw < 0:
                return score
        return scores[-1]

    def _block_size(self, view: WorkerView) -> int:
        layout = view.info.layout
        return layout.block_size if layout is not None and layout.block_size > 0 else self.config.block_size
