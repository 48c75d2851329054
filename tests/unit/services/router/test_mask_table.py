"""The compiled hash -> slot-mask table against a dict of sets: random sets and clears on a table small enough to
collide, wrap around, grow and widen, with depths checked against a walk done by hand."""

import random

import numpy as np
import pytest

from services.router.mask_table import MaskTable


def reference_depths(model: dict[int, set[int]], keys: list[int], num_slots: int) -> list[int]:
    out = [0] * num_slots
    for slot in range(num_slots):
        while out[slot] < len(keys) and slot in model.get(keys[out[slot]], ()):
            out[slot] += 1
    return out


def check(table: MaskTable, model: dict[int, set[int]], rng: random.Random) -> None:
    assert len(table) == len(model) and set(table.keys()) == set(model)
    pool = sorted(model) + [rng.getrandbits(64) for _ in range(3)]
    for _ in range(20):
        keys = [rng.choice(pool) for _ in range(rng.randrange(1, 8))]
        out = np.zeros(table.num_slots + 1, np.int64)
        deepest = table.depths(np.array(keys, np.uint64), out)
        expected = reference_depths(model, keys, table.num_slots)
        assert list(out[:-1]) == expected and out[-1] == 0 and deepest == max(expected)


@pytest.mark.parametrize("seed", range(4))
def test_random_sets_and_clears_match_a_dict_of_sets(seed):
    rng = random.Random(seed)
    table, model = MaskTable(64, 2), {}
    # few distinct keys, some equal in their low bits, so probes collide and rows shift back on removal
    keys = [rng.getrandbits(64) for _ in range(40)] + [k << 20 for k in range(1, 20)] + [2**64 - 1, 0]
    slots = 64
    for step in range(1500):
        key, slot = rng.choice(keys), rng.randrange(slots)
        roll = rng.random()
        if roll < 0.55:
            table.set([key], slot)
            model.setdefault(key, set()).add(slot)
        elif roll < 0.95:
            table.clear([key], [slot])
            if slot in model.get(key, ()):
                model[key].discard(slot)
                if not model[key]:
                    del model[key]
        else:
            held = [k for k, s in model.items() if slot in s]
            table.clear(held, [slot] * len(held))
            for k in held:
                model[k].discard(slot)
                if not model[k]:
                    del model[k]
        if step == 700:  # more workers than slots: every mask doubles, nothing is lost
            table.widen()
            slots = 128
        if step % 100 == 0:
            check(table, model, rng)
    check(table, model, rng)


def test_a_running_and_stops_a_slot_at_its_first_missing_block():
    table = MaskTable()
    table.set([10, 11, 13], 0)  # slot 0 holds blocks 10, 11 and 13 but not 12
    table.set([10, 11, 12, 13], 5)
    out = np.zeros(table.num_slots + 1, np.int64)
    assert table.depths(np.array([10, 11, 12, 13, 99], np.uint64), out) == 4
    assert out[0] == 2 and out[5] == 4 and out.sum() == 6


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        MaskTable(num_slots=65)
    with pytest.raises(ValueError):
        MaskTable(num_rows=3)
