"""One KV tier below the device pool (host memory or disk): which block hashes it holds, in which slot, in LRU
order, and which are pinned by a copy in flight. Pure accounting: no torch, no I/O; the runner moves the bytes."""

from collections import OrderedDict
from dataclasses import dataclass

from engines.base.events import KvTier


@dataclass(slots=True, eq=False)
class TierBlock:
    """One block held by a tier. `slot` names where its bytes are (a host pool slot; on disk, a file named by
    the hash, the slot only counts capacity)."""

    block_hash: int
    parent_hash: int
    token_ids: tuple[int, ...]  # to confirm a hash hit, as the device cache does
    slot: int
    num_pins: int = 0  # copies reading it (a load, a write to disk): never evicted meanwhile


class TierPool:
    """`num_slots` blocks at most; a full pool evicts its least recently used unpinned block.

    NOTE: the front of `blocks` is the least recently used; `touch` and `put` move a block to the back.
    """

    def __init__(self, tier: KvTier, num_slots: int):
        if num_slots < 0:
            raise ValueError(f"a tier holds >= 0 blocks, got {num_slots}")
        self.tier = tier
        self.num_slots = num_slots
        self.blocks: OrderedDict[int, TierBlock] = OrderedDict()  # block hash -> block
        self._free_slots = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.stored: list[tuple[int, int]] = []  # (parent hash, hash) since the last drain
        self.removed: list[int] = []

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.blocks

    def get(self, block_hash: int, parent_hash: int, token_ids: tuple[int, ...]) -> TierBlock | None:
        """The block, if held and its tokens and parent confirm the hash (a collision never serves)."""
        block = self.blocks.get(block_hash)
        if block is None or block.token_ids != token_ids or block.parent_hash != parent_hash:
            return None
        return block

    def touch(self, block_hash: int) -> None:
        if block_hash in self.blocks:
            self.blocks.move_to_end(block_hash)

    def put(
        self, parent_hash: int, block_hash: int, token_ids: tuple[int, ...]
    ) -> tuple[TierBlock | None, list[TierBlock]]:
        """Hold a block (a held hash is only touched): the block, or None when every slot is pinned; and the
        blocks evicted to make room."""
        held = self.blocks.get(block_hash)
        if held is not None:
            self.blocks.move_to_end(block_hash)
            return held, []
        evicted: list[TierBlock] = []
        if not self._free_slots:
            victim = self._lru_unpinned()
            if victim is None:
                return None, []
            removed = self.remove(victim.block_hash)
            assert removed is not None  # NOTE: the victim was just found held
            evicted.append(removed)
        block = TierBlock(block_hash, parent_hash, token_ids, self._free_slots.pop())
        self.blocks[block_hash] = block
        self.stored.append((parent_hash, block_hash))
        return block, evicted

    def remove(self, block_hash: int) -> TierBlock | None:
        block = self.blocks.pop(block_hash, None)
        if block is not None:
            self._free_slots.append(block.slot)
            self.removed.append(block_hash)
        return block

    def clear(self) -> list[TierBlock]:
        """Forget every block (pins too); returns them."""
        gone = list(self.blocks.values())
        self.blocks.clear()
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self.stored, self.removed = [], []
        return gone

    def drain(self) -> tuple[list[tuple[int, int]], list[int]]:
        """What was stored and removed since the last drain."""
        out = self.stored, self.removed
        self.stored, self.removed = [], []
        return out

    def _lru_unpinned(self) -> TierBlock | None:
        return next((b for b in self.blocks.values() if not b.num_pins), None)
