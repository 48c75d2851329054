"""TensorRT-LLM's KV cache events -> tandem's KvEvents, with tandem's block hashes.

The router hashes an incoming prompt with engines/base/block_hash.py and looks the hashes up in its index, so
the index must hold tandem's hashes. TensorRT-LLM names blocks by its own hash (a C++ hash over the tokens and
extra keys that tandem cannot recompute), but every stored event carries each block's tokens and its parent's
hash: this mapper rehashes each full block with tandem's chained hash, remembers TensorRT-LLM's hash -> tandem's,
and translates removals, tier moves (cache_level updates) and gaps through that map. A partial block (fewer
tokens than the block size) has no tandem hash and is not announced. Pure: dicts in, events out."""

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from engines.base.block_hash import NONE_HASH, hash_block
from engines.base.events import KvEvent, KvEventLog, KvTier

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Block:
    tandem_hash: int
    parent: int  # tandem's hash of the parent block
    tier: KvTier


def _tier(cache_level) -> KvTier:
    return KvTier.DEVICE if not cache_level else KvTier.HOST  # 0: GPU memory; 1: host (offloaded) memory


class TrtllmKvEvents:
    def __init__(self, block_size: int, log_: KvEventLog | None = None, root: int = NONE_HASH):
        self.block_size = block_size
        self._root = root  # the deployment's unsalted chain root (block_hash.chain_root("", secret)): hashed, unsaid
        self.log = log_ or KvEventLog()
        self._blocks: dict[int, _Block] = {}  # TensorRT-LLM's block hash -> tandem's view of it
        self._refs: Counter[tuple[int, KvTier]] = Counter()  # blocks of equal tokens share tandem's hash
        self._last_id: int | None = None
        self._window: int | None = None  # the full-attention layers' window: events of other windows are skipped
        self.num_dropped = 0  # stored events whose parent block is unknown (its chain cannot be hashed)

    def ingest(self, raw: Iterable[dict]) -> list[KvEvent]:
        events: list[KvEvent] = []
        for event in raw:
            events += self._one(event)
        return events

    def _one(self, event: dict) -> list[KvEvent]:
        out: list[KvEvent] = []
        event_id = event.get("event_id")
        if event_id is not None and self._last_id is not None and event_id != self._last_id + 1:
            # NOTE: events were lost (TensorRT-LLM's buffer overflowed): forget everything rather than be wrong
            log.warning(
                "KV events %d..%d lost; announcing this worker's cache cleared", self._last_id + 1, event_id - 1
            )
            out.append(self._clear())
        self._last_id = event_id if event_id is not None else self._last_id
        data = event.get("data") or {}
        kind = data.get("type")
        if kind == "created":
            self._window = max(self._window or 0, event.get("window_size") or 0) or None
        elif self._window and event.get("window_size") not in (None, self._window):
            pass  # a sliding-window layer group: the router follows the full-attention blocks only
        elif kind == "stored":
            out += self._stored(data)
        elif kind == "removed":
            out += self._removed(data.get("block_hashes") or ())
        elif kind == "updated":
            out += self._updated(data)
        return out

    def _stored(self, data: dict) -> list[KvEvent]:
        parent_trt = data.get("parent_hash")
        if parent_trt is not None and parent_trt not in self._blocks:
            self.num_dropped += 1
            return []
        parent = NONE_HASH if parent_trt is None else self._blocks[parent_trt].tandem_hash
        chain = self._root if parent_trt is None else parent  # NOTE: a first block chains on the root, published as 0
        runs: list[tuple[int, KvTier, list[int]]] = []  # (first parent, tier, hashes) per tier run
        for block in data.get("blocks") or ():
            tokens = [t["token_id"] for t in block.get("tokens") or ()]
            if len(tokens) != self.block_size or block.get("block_hash") is None:
                break  # partial: the last block of a sequence, never a parent
            tier, tandem_hash = _tier(block.get("cache_level")), hash_block(chain, tokens)
            self._forget(block["block_hash"])
            self._blocks[block["block_hash"]] = _Block(tandem_hash, parent, tier)
            self._refs[(tandem_hash, tier)] += 1
            if runs and runs[-1][1] == tier:
                runs[-1][2].append(tandem_hash)
            else:
                runs.append((parent, tier, [tandem_hash]))
            parent = chain = tandem_hash
        return [self.log.stored(first, hashes, tier) for first, tier, hashes in runs]

    def _removed(self, trt_hashes: Iterable[int]) -> list[KvEvent]:
        gone: dict[KvTier, list[int]] = {}
        for trt_hash in trt_hashes:
            block = self._forget(trt_hash)
            if block is not None and not self._refs[(block.tandem_hash, block.tier)]:
                gone.setdefault(block.tier, []).append(block.tandem_hash)
        return [self.log.removed(hashes, tier) for tier, hashes in gone.items()]

    def _updated(self, data: dict) -> list[KvEvent]:
        """A block moved between GPU and host memory: removed from one tier, stored in the other."""
        block, diff = self._blocks.get(data.get("block_hash")), data.get("cache_level")
        if block is None or not diff or _tier(diff.get("new_value")) == block.tier:
            return []
        out = self._removed([data["block_hash"]])
        moved = _Block(block.tandem_hash, block.parent, _tier(diff.get("new_value")))
        self._blocks[data["block_hash"]] = moved
        self._refs[(moved.tandem_hash, moved.tier)] += 1
        return out + [self.log.stored(moved.parent, [moved.tandem_hash], moved.tier)]

    def _forget(self, trt_hash: int) -> _Block | None:
        block = self._blocks.pop(trt_hash, None)
        if block is not None:
            self._refs[(block.tandem_hash, block.tier)] -= 1
        return block

    def _clear(self) -> KvEvent:
        self._blocks.clear()
        self._refs.clear()
        return self.log.cleared()
