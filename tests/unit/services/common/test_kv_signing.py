"""Signed KV handles: what a decode worker's verifier accepts and what it refuses, each refusal with its reason."""

import os

import pytest

from engines.base.types import KvLayout
from engines.transfer import descriptor
from engines.transfer.descriptor import NIXL, KvDescriptor
from services.common.errors import status_for
from services.common.kv_signing import (
    HandleInvalid,
    HandleNotTrusted,
    KvSigner,
    KvVerifier,
    ReplayGuard,
    parse_key,
    prompt_hash,
)
from services.common.protos import common_pb2

KEY = bytes(range(32))
NOW = 1_800_000_000.0
TOKENS = tuple(range(100, 140))  # 40 tokens: 3 blocks of 16
LAYOUT = KvLayout(2, 2, 8, "float32", 16)


def nixl_params(block_ids=(7, 8, 9)) -> bytes:
    return descriptor.encode(KvDescriptor(NIXL, LAYOUT, TOKENS, tuple(block_ids), "agent-a", b"meta", 4096, 64))


def handle(key=KEY, tokens=TOKENS, expires=NOW + 30, **fields) -> common_pb2.KvHandle:
    h = common_pb2.KvHandle(
        worker_id="prefill-0",
        address="127.0.0.1:5001",
        req_id="r1",
        num_tokens=len(tokens),
        num_blocks=-(-len(tokens) // 16),
        lease_expires_unix_s=expires,
        engine_params=nixl_params(),
        layout=common_pb2.KvLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", block_size=16),
    )
    for name, value in fields.items():
        setattr(h, name, value)
    KvSigner(key).seal(h, tokens)
    return h


def refused(h, tokens=TOKENS, key=KEY, now=NOW):
    with pytest.raises((HandleNotTrusted, HandleInvalid)) as info:
        KvVerifier(key).check(h, tokens, now)
    return info.value


def test_a_sealed_handle_verifies_for_its_prompt_and_a_longer_request():
    verifier = KvVerifier(KEY)
    verifier.check(handle(), TOKENS, NOW)
    verifier.check(handle(), TOKENS + (5,), NOW)  # the prefill worker's first token follows the prompt
    assert len(handle().signature) == 32 and handle().prompt_hash == prompt_hash(TOKENS)


def test_forged_handle_without_a_signature_is_not_trusted():
    h = handle(key=None)
    assert not h.signature
    exc = refused(h)
    assert (exc.reason, status_for(exc).name) == ("unsigned", "PERMISSION_DENIED")


def test_handle_signed_with_a_foreign_key_is_not_trusted():
    exc = refused(handle(key=os.urandom(32)))
    assert (exc.reason, status_for(exc).name) == ("bad_signature", "PERMISSION_DENIED")


@pytest.mark.parametrize(
    "field,value",
    [
        ("address", "10.0.0.66:5001"),  # the attacker's address under an honest signature
        ("worker_id", "prefill-9"),
        ("req_id", "r2"),
        ("num_tokens", 32),
        ("lease_expires_unix_s", NOW + 3600),  # a longer lease
        ("engine_params", nixl_params(block_ids=(0, 1, 2))),  # other blocks of the source's cache
    ],
)
def test_any_field_changed_after_signing_breaks_the_signature(field, value):
    h = handle()
    setattr(h, field, value)
    assert refused(h).reason == "bad_signature"


def test_tampered_block_ids_are_refused_even_with_the_length_kept():
    h = handle()
    h.engine_params = nixl_params(block_ids=(7, 8, 10))
    assert refused(h).reason == "bad_signature"


def test_expired_handle_is_invalid():
    exc = refused(handle(expires=NOW - 1))
    assert (exc.reason, status_for(exc).name) == ("expired", "INVALID_ARGUMENT")


def test_handle_for_another_prompt_is_invalid():
    other = TOKENS[:-1] + (9,)
    exc = refused(handle(), tokens=other)
    assert (exc.reason, status_for(exc).name) == ("wrong_prompt", "INVALID_ARGUMENT")
    assert refused(handle(), tokens=TOKENS[:10]).reason == "wrong_prompt"  # shorter than the KV


def test_a_wrong_prompt_hash_signed_honestly_still_fails_against_the_request():
    h = handle(tokens=TOKENS)
    h.prompt_hash = prompt_hash(TOKENS[::-1])  # swapped in after signing: the signature breaks first
    assert refused(h).reason == "bad_signature"


def test_replayed_handle_is_refused_the_second_time():
    verifier, h = KvVerifier(KEY), handle()
    verifier.check(h, TOKENS, NOW)
    verifier.claim(h, NOW)
    verifier.check(h, TOKENS, NOW)  # still valid on its face...
    with pytest.raises(HandleNotTrusted) as info:
        verifier.claim(h, NOW + 1)  # ...but used
    assert (info.value.reason, status_for(info.value).name) == ("replayed", "PERMISSION_DENIED")


def test_replay_guard_forgets_handles_once_their_lease_is_over():
    guard = ReplayGuard()
    assert guard.claim(b"a", 10.0, now=0.0) and guard.claim(b"b", 20.0, now=0.0)
    assert not guard.claim(b"a", 10.0, now=5.0)
    assert guard.claim(b"c", 30.0, now=15.0)  # "a" lapsed: forgotten (an expired handle is refused anyway)
    assert len(guard) == 2


def test_without_a_key_handles_are_unsigned_and_only_lease_and_prompt_are_checked():
    h = handle(key=None)
    KvVerifier(None).check(h, TOKENS, NOW)
    assert refused(h, key=None, now=NOW + 60).reason == "expired"
    assert refused(h, tokens=TOKENS[::-1], key=None).reason == "wrong_prompt"


@pytest.mark.parametrize("text,error", [("zz" * 32, "hex"), ("ab" * 31, "at least 32 bytes"), ("", "at least")])
def test_bad_key_files_are_refused(text, error):
    with pytest.raises(ValueError, match=error):
        parse_key(text)


def test_key_file_text_is_hex_with_whitespace_allowed():
    assert parse_key(KEY.hex() + "\n") == KEY
