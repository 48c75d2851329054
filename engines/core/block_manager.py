"""Paged KV block accounting: reference counts, a prefix cache keyed by the chained block hash
(confirmed by token ids), and LRU reuse of freed cached blocks. No torch, no I/O."""

from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from engines.base.block_hash import NONE_HASH, hash_block, num_blocks_for
from engines.core.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # set once the block is full and registered in the cache
    token_ids: tuple[int, ...] = ()  # the block's tokens, to confirm a hash hit
    parent_hash: int = NONE_HASH


@dataclass(slots=True)
class BlockEvents:
    """What changed in the cache since the last drain: what KV events are made of."""

    stored: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)  # (parent, hash, tokens)
    removed: list[int] = field(default_factory=list)
    cleared: bool = False  # the whole cache was reset before `stored` and `removed` happened


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # NOTE: every block with ref_count 0 is here; the front is evicted first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.num_cached_free_blocks = 0  # NOTE: a counter, kept as blocks come and go: stats never scan
        self.events = BlockEvents()

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def num_blocks_for(self, num_tokens: int) -> int:
        return num_blocks_for(num_tokens, self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Longest cached prefix of `seq`'s full blocks, leaving at least one token to compute."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        hits: list[int] = []
        for i in range(max_blocks):
            block_id = self.cached.get(seq.block_hashes[i])
            if block_id is None or not self._confirms(self.blocks[block_id], seq, i):
                break
            hits.append(block_id)
        return hits

    def _confirms(self, block: Block, seq: Sequence, i: int) -> bool:
        """A hash hit counts only if the block's tokens and its parent's hash match too.

        NOTE: a hash collision must never serve another prefix's KV. Blocks before i were
        confirmed the same way, so only a 64-bit collision of two parents remains possible.
        """
        tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
        parent = seq.block_hashes[i - 1] if i else NONE_HASH
        return block.token_ids == tokens and block.parent_hash == parent

    # -- actions -----------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed: Seq[int] = (), cache: bool = True) -> bool:
        """Give `seq` blocks for `num_new_tokens` more tokens (after `computed` cache hits).

        All or nothing: returns False and changes nothing when the blocks are not there. `cache=False` leaves
        the new blocks out of the prefix cache (a load fills them later: nobody may hit them before).
        """
        bs = self.block_size
        if not computed:  # NOTE: the per-decode-step case: room in the last block and no block newly full
            num_after = seq.num_computed_tokens + num_new_tokens
            if num_after <= len(seq.block_table) * bs and (
                not self.enable_prefix_caching or min(num_after, len(seq.token_ids)) // bs <= seq.num_registered_blocks
            ):
                return True
        num_after = seq.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_needed = self.num_blocks_for(num_after) - len(seq.block_table) - len(computed)
        num_revived = sum(1 for b in computed if self.blocks[b].ref_count == 0)
        if num_needed + num_revived > self.num_free_blocks:
            return False
        for block_id in computed:
            self._touch(block_id)
        seq.block_table.extend(computed)
        seq.num_computed_tokens += len(computed) * self.block_size
        seq.block_table.extend(self._pop_free() for _ in range(max(num_needed, 0)))
        if cache:
            self._cache_full_blocks(seq, num_after)
        return True

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register `seq`'s blocks that are full within its first `num_tokens` (their KV is written now)."""
        self._cache_full_blocks(seq, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s references. Tail blocks are freed first so they are evicted first."""
        self.truncate(seq, 0)

    def truncate(self, seq: Sequence, num_blocks: int) -> None:
        """Drop `seq`'s references to its blocks past the first `num_blocks`, tail first."""
        for block_id in reversed(seq.block_table[num_blocks:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)  # nothing worth keeping
                else:
                    self.num_cached_free_blocks += 1
        seq.block_table = seq.block_table[:num_blocks]
        seq.num_registered_blocks = min(seq.num_registered_blocks, num_blocks)

    def uncache_from(self, seq: Sequence, num_tokens: int) -> None:
        """Forget cached blocks of `seq` past its first `num_tokens` (their KV was never written)."""
        for block_id in seq.block_table[num_tokens // self.block_size :]:
            block = self.blocks[block_id]
            if block.block_hash is not None and self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                self.events.removed.append(block.block_hash)
            block.block_hash, block.token_ids = None, ()
        seq.num_registered_blocks = min(seq.num_registered_blocks, num_tokens // self.block_size)

    def reset_prefix_cache(self) -> int | None:
        """Forget every cached prefix; None (nothing changed) while any block is in use. Returns how many
        cached blocks were dropped; the next drain starts with `cleared`."""
        if len(self.free_queue) < len(self.blocks):  # some block is in use
            return None
        dropped = len(self.cached)
        for block in self.blocks:
            block.block_hash, block.token_ids, block.parent_hash = None, (), NONE_HASH
        self.cached.clear()
        self.num_cached_free_blocks = 0
        self.events = BlockEvents(cleared=True)  # NOTE: what was pending is moot: everything is gone
        return dropped

    def drain_events(self) -> BlockEvents:
        events, self.events = self.events, BlockEvents()
        return events

    # -- internals ---------------------------------------------------------------------------
    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:  # a cached free block revived by a prefix hit
            del self.free_queue[block_id]
            self.num_cached_free_blocks -= 1
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict its cached content
            self.num_cached_free_blocks -= 1
            if self.cached.get(block.block_hash) == block_id:
                del self.cached[block.block_hash]
                self.events.removed.append(block.block_hash)
            block.block_hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def _extend_hashes(self, seq: Sequence, num_blocks: int) -> None:
        bs = self.block_size
        while len(seq.block_hashes) < num_blocks:
            i = len(seq.block_hashes)
            # NOTE: the root enters the hash only; Block.parent_hash of a first block stays NONE_HASH, so events
            # and tiers never carry a tenant's root
            parent = seq.block_hashes[-1] if i else seq.hash_root
            seq.block_hashes.append(hash_block(parent, seq.token_ids[i * bs : (i + 1) * bs]))

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register the blocks that will be full once `num_tokens` of `seq` are computed."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_tokens, seq.num_tokens) // self.block_size
        self._extend_hashes(seq, num_full)
        bs = self.block_size
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is not None:  # a prefix-cache hit: registered already
                continue
            h = seq.block_hashes[i]
            block.block_hash = h
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            block.parent_hash = seq.block_hashes[i - 1] if i else NONE_HASH
            if h not in self.cached:  # NOTE: an identical block already cached stays the one served
                self.cached[h] = block.block_id
                self.events.stored.append((block.parent_hash, h, block.token_ids))
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)
