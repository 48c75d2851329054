"""Block hash -> bitmask of worker slots, as one open-addressing table in a numpy array whose probes numba compiles,
so a prompt's prefix depth on every slot is one call with no Python work per block. Pure: no I/O; it knows nothing
of workers or events (`SlotIndex` maps workers to slots and keeps the table in step with its holders).
"""

import functools
import secrets
from collections.abc import Collection, Iterator, Sequence

import numba
import numpy as np

_U64 = np.uint64
_MIN_ROWS = 1 << 10
_MAX_LOAD = 0.5  # rows in use per row: linear probing stays short below this


@numba.njit(cache=True, inline="always")
def _home(key, mult, shift):
    # NOTE: multiplicative hashing with a per-process odd multiplier: a client that crafts prompts whose block
    # hashes share low bits still cannot make them share a home row
    return np.int64((key * mult) >> shift)


@numba.njit(cache=True, inline="always")
def _is_empty(table, row):
    for w in range(1, table.shape[1]):
        if table[row, w] != 0:
            return False
    return True


@numba.njit(cache=True)
def _find(table, mult, shift, key):
    """The row holding `key`, or -1. NOTE: a row is in use exactly when its mask is not all zero."""
    last = table.shape[0] - 1
    row = _home(key, mult, shift)
    while not _is_empty(table, row):
        if table[row, 0] == key:
            return row
        row = (row + 1) & last
    return -1


@numba.njit(cache=True)
def _set_bit(table, mult, shift, key, word, bit):
    """Set one slot's bit on `key`'s mask, adding the key if absent; 1 when it was added."""
    last = table.shape[0] - 1
    row = _home(key, mult, shift)
    while not _is_empty(table, row):
        if table[row, 0] == key:
            table[row, word] |= bit
            return 0
        row = (row + 1) & last
    table[row, 0] = key
    table[row, word] = bit
    return 1


@numba.njit(cache=True)
def _clear_bit(table, mult, shift, key, word, bit):
    """Clear one slot's bit; a mask left empty frees its row (backward shift, so no tombstones). 1: freed."""
    row = _find(table, mult, shift, key)
    if row < 0:
        return 0
    table[row, word] &= ~bit
    if not _is_empty(table, row):
        return 0
    _remove_row(table, mult, shift, row)
    return 1


@numba.njit(cache=True)
def _remove_row(table, mult, shift, row):
    """Free `row` and pull back the rows after it whose probe passed through it."""
    last = table.shape[0] - 1
    hole, nxt = row, row
    while True:
        nxt = (nxt + 1) & last
        if _is_empty(table, nxt):
            break
        home = _home(table[nxt, 0], mult, shift)
        # the row may move back into the hole unless its home lies cyclically in (hole, nxt]
        if (hole < nxt and hole < home <= nxt) or (hole > nxt and (home > hole or home <= nxt)):
            continue
        table[hole, :] = table[nxt, :]
        hole = nxt
    table[hole, :] = 0


@numba.njit(cache=True)
def _set_many(table, mult, shift, keys, word, bit):
    """Set one slot's bit on each of `keys`; returns how many keys were added."""
    added = 0
    for i in range(keys.shape[0]):
        added += _set_bit(table, mult, shift, keys[i], word, bit)
    return added


@numba.njit(cache=True)
def _clear_many(table, mult, shift, keys, slots):
    """Clear slot `slots[i]`'s bit on `keys[i]`, for each i; returns how many rows were freed."""
    freed = 0
    for i in range(keys.shape[0]):
        freed += _clear_bit(table, mult, shift, keys[i], 1 + slots[i] // 64, np.uint64(1) << np.uint64(slots[i] % 64))
    return freed


@numba.njit(cache=True)
def _rehash(old, new, mult, shift):
    """Every row of `old` into `new` (a table of more rows, or of wider masks, or both)."""
    last, width = new.shape[0] - 1, old.shape[1]
    for src in range(old.shape[0]):
        if _is_empty(old, src):
            continue
        row = _home(old[src, 0], mult, shift)
        while not _is_empty(new, row):
            row = (row + 1) & last
        new[row, :width] = old[src, :]


@numba.njit(cache=True)
def _depths(table, mult, shift, keys, out):
    """out[slot] = how many leading `keys` the slot holds (a running AND: a slot that misses one block holds none
    after it); returns the deepest. `out` must be zeros, one entry per slot (and more, left untouched)."""
    num_words = table.shape[1] - 1
    held = np.empty(num_words, np.uint64)
    depth = 0
    for i in range(keys.shape[0]):
        row = _find(table, mult, shift, keys[i])
        if row < 0:
            break
        alive = False
        for w in range(num_words):
            before = held[w] if i else ~np.uint64(0)
            after = before & table[row, w + 1]
            held[w] = after
            alive = alive or after != 0
            _mark(before & ~after, w, i, out)
        if not alive:
            return depth
        depth = i + 1
    for w in range(num_words):
        if depth:
            _mark(held[w], w, depth, out)
    return depth


@numba.njit(cache=True, inline="always")
def _mark(bits, word, value, out):
    """out[slot] = value for each slot whose bit is set in `bits` (slot = 64 * word + bit position)."""
    base = 64 * word
    while bits:
        low = bits & (~bits + np.uint64(1))
        out[base + _bit_position(low)] = value
        bits ^= low


@numba.njit(cache=True, inline="always")
def _bit_position(power_of_two):
    pos, v = 0, power_of_two
    if v >> np.uint64(32):
        pos, v = pos + 32, v >> np.uint64(32)
    if v >> np.uint64(16):
        pos, v = pos + 16, v >> np.uint64(16)
    if v >> np.uint64(8):
        pos, v = pos + 8, v >> np.uint64(8)
    if v >> np.uint64(4):
        pos, v = pos + 4, v >> np.uint64(4)
    if v >> np.uint64(2):
        pos, v = pos + 2, v >> np.uint64(2)
    if v >> np.uint64(1):
        pos += 1
    return pos


@functools.cache
def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel now, on a tiny table, so no live decision waits for it."""
    table = MaskTable(64, 4)
    table.set([1, 2, 3], 0)
    table.clear([2, 1], [0, 0])
    table.widen()
    table.depths(np.array([3], _U64), np.zeros(table.num_slots + 1, np.int64))


class MaskTable:
    """Keys with a non-empty mask of `num_slots` bits (a multiple of 64; `widen` doubles it). Grows its rows by
    doubling, so the table holds at most half as many keys as rows."""

    def __init__(self, num_slots: int = 64, num_rows: int = _MIN_ROWS):
        if num_slots < 64 or num_slots % 64 or num_rows < 2 or num_rows & (num_rows - 1):
            raise ValueError(f"need slots a multiple of 64 and rows a power of two, got {num_slots}, {num_rows}")
        self._mult = _U64(secrets.randbits(64) | 1)
        self._table = np.zeros((num_rows, 1 + num_slots // 64), _U64)  # [rows, key + mask words]
        self._shift = _U64(64 - (num_rows.bit_length() - 1))
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def num_slots(self) -> int:
        return 64 * (self._table.shape[1] - 1)

    def keys(self) -> Iterator[int]:
        in_use = self._table[:, 1:].any(axis=1)
        return (int(k) for k in self._table[in_use, 0])

    def set(self, keys: Sequence[int], slot: int) -> None:
        """Set `slot`'s bit on every one of `keys` (one worker's stored blocks)."""
        while self._len + len(keys) > _MAX_LOAD * len(self._table):
            self._resize(2 * len(self._table), self._table.shape[1])
        found = np.fromiter(keys, _U64, len(keys))
        self._len += _set_many(self._table, self._mult, self._shift, found, 1 + slot // 64, _U64(1 << slot % 64))

    def clear(self, keys: Collection[int], slots: Collection[int]) -> None:
        """Clear slot `slots[i]`'s bit on `keys[i]`, for each i; a mask left empty frees its key."""
        found, where = np.fromiter(keys, _U64, len(keys)), np.fromiter(slots, np.int64, len(slots))
        self._len -= _clear_many(self._table, self._mult, self._shift, found, where)

    def widen(self) -> None:
        """Twice as many slots per mask (rare: more workers than slots)."""
        self._resize(len(self._table), 1 + 2 * (self._table.shape[1] - 1))

    def kernel_args(self) -> tuple[np.ndarray, np.uint64, np.uint64]:
        """(table, multiplier, shift): what a compiled caller passes on to `_depths` (valid until the next change)."""
        return self._table, self._mult, self._shift

    def depths(self, keys: np.ndarray, out: np.ndarray) -> int:
        """out[slot] = the leading `keys` (uint64) the slot holds; `out` zeros, at least `num_slots` long."""
        return _depths(self._table, self._mult, self._shift, keys, out)

    def _resize(self, num_rows: int, num_columns: int) -> None:
        new = np.zeros((num_rows, num_columns), _U64)
        shift = _U64(64 - (num_rows.bit_length() - 1))
        _rehash(self._table, new, self._mult, shift)
        self._table, self._shift = new, shift
