"""TensorRT-LLM's KV event dicts (their format in the pinned release) -> tandem's KvEvents, rehashed with
tandem's chained hash so the router's index matches what it computes for a prompt."""

from engines.base.block_hash import NONE_HASH, chain_block_hashes
from engines.base.events import KvEventKind, KvTier
from engines.trtllm.events import TrtllmKvEvents

BS = 4


def block(trt_hash, tokens, level=0):
    return {
        "type": "stored_block",
        "block_hash": trt_hash,
        "cache_level": level,
        "priority": 35,
        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
    }


def stored(event_id, parent, *blocks, window=4096):
    return {
        "event_id": event_id,
        "window_size": window,
        "data": {"type": "stored", "parent_hash": parent, "blocks": list(blocks)},
    }


def removed(event_id, *hashes):
    return {"event_id": event_id, "window_size": 4096, "data": {"type": "removed", "block_hashes": list(hashes)}}


def moved(event_id, trt_hash, new, old):
    return {
        "event_id": event_id,
        "window_size": 4096,
        "data": {
            "type": "updated",
            "block_hash": trt_hash,
            "priority": None,
            "cache_level": {"type": "event_diff", "new_value": new, "old_value": old},
        },
    }


def created(event_id=0, window=4096):
    return {
        "event_id": event_id,
        "window_size": window,
        "data": {"type": "created", "num_blocks_per_cache_level": [100, 0]},
    }


TOKENS = list(range(100, 112))  # three full blocks of 4
H = chain_block_hashes(TOKENS, BS)  # what the router computes for this prompt


def test_stored_blocks_carry_tandems_chained_hashes_and_partial_blocks_are_not_announced():
    m = TrtllmKvEvents(BS)
    events = m.ingest(
        [
            created(),
            stored(
                1, None, block(901, TOKENS[:4]), block(902, TOKENS[4:8]), block(903, TOKENS[8:]), block(904, [7, 8])
            ),
        ]
    )
    assert [(e.kind, e.parent_hash, e.block_hashes, e.tier) for e in events] == [
        (KvEventKind.STORED, NONE_HASH, tuple(H), KvTier.DEVICE)
    ]
    more = m.ingest([stored(2, 902, block(905, TOKENS[8:]))])  # a child of a known block chains on tandem's hash
    assert more[0].parent_hash == H[1] and more[0].block_hashes == (H[2],)


def test_a_block_whose_parent_is_unknown_cannot_be_hashed_and_is_dropped():
    m = TrtllmKvEvents(BS)
    assert m.ingest([stored(1, 12345, block(901, TOKENS[:4]))]) == [] and m.num_dropped == 1


def test_removals_translate_through_the_map_and_unknown_hashes_are_ignored():
    m = TrtllmKvEvents(BS)
    m.ingest([stored(1, None, block(901, TOKENS[:4]), block(902, TOKENS[4:8]), block(904, [1]))])
    events = m.ingest([removed(2, 902, 904, 777)])
    assert [(e.kind, e.block_hashes) for e in events] == [(KvEventKind.REMOVED, (H[1],))]
    assert m.log.snapshot().events[0].block_hashes == (H[0],)


def test_blocks_of_equal_tokens_leave_the_index_with_the_last_of_them():
    m = TrtllmKvEvents(BS)
    m.ingest([stored(1, None, block(901, TOKENS[:4])), stored(2, None, block(951, TOKENS[:4]))])  # e.g. a salt
    assert m.ingest([removed(3, 901)]) == []
    assert [e.block_hashes for e in m.ingest([removed(4, 951)])] == [(H[0],)]


def test_a_block_moved_to_host_memory_changes_tier():
    m = TrtllmKvEvents(BS)
    m.ingest([stored(1, None, block(901, TOKENS[:4]), block(902, TOKENS[4:8]))])
    events = m.ingest([moved(2, 902, 1, 0)])
    assert [(e.kind, e.parent_hash, e.block_hashes, e.tier) for e in events] == [
        (KvEventKind.REMOVED, NONE_HASH, (H[1],), KvTier.DEVICE),
        (KvEventKind.STORED, H[0], (H[1],), KvTier.HOST),
    ]
    assert [e.kind for e in m.ingest([removed(3, 902)])] == [KvEventKind.REMOVED]
    assert m.log.snapshot().events[0].tier is KvTier.DEVICE and len(m.log.snapshot().events) == 1


def test_lost_events_clear_the_workers_blocks_rather_than_leave_them_wrong():
    m = TrtllmKvEvents(BS)
    m.ingest([stored(1, None, block(901, TOKENS[:4]))])
    events = m.ingest([stored(5, 901, block(902, TOKENS[4:8]))])  # 2..4 lost: 901 may be gone
    assert [e.kind for e in events] == [KvEventKind.CLEARED]  # and its child cannot be hashed any more
    assert m.log.snapshot().events == () and m.num_dropped == 1


def test_only_the_full_attention_window_is_followed():
    m = TrtllmKvEvents(BS)
    m.ingest([created(0, 4096), created(1, 128)])
    assert m.ingest([stored(2, None, block(901, TOKENS[:4]), window=128)]) == []
    assert len(m.ingest([stored(3, None, block(901, TOKENS[:4]), window=4096)])) == 1


def test_events_are_numbered_in_tandems_log():
    m = TrtllmKvEvents(BS)
    m.ingest([stored(1, None, block(901, TOKENS[:4])), removed(2, 901)])
    assert [e.seq for e in m.log.since(0)] == [1, 2]


def test_under_a_deployment_secret_the_chain_starts_at_its_root_which_is_never_published():
    from engines.base.block_hash import chain_root

    root = chain_root("", "secret")
    m = TrtllmKvEvents(BS, root=root)
    events = m.ingest([created(), stored(1, None, block(901, TOKENS[:4]), block(902, TOKENS[4:8]))])
    salted = chain_block_hashes(TOKENS, BS, root)  # what the router computes for an unsalted prompt
    assert [(e.parent_hash, e.block_hashes) for e in events] == [(NONE_HASH, tuple(salted[:2]))]
    assert m.ingest([stored(2, 902, block(903, TOKENS[8:]))])[0].block_hashes == (salted[2],)
    assert [e.parent_hash for e in m.ingest([moved(3, 901, 1, 0)]) if e.kind is KvEventKind.STORED] == [NONE_HASH]
