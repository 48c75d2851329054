"""Signed KV handles: a prefill worker seals each KvHandle it hands out (HMAC-SHA256 with the deployment's shared
key over everything the handle names); a decode worker checks the seal, the lease and the prompt, and claims the
handle once. Pure: no I/O and no clock of its own (callers pass `now`); the router check is the decode shell's."""

import hashlib
import hmac
import sys
from array import array
from collections import deque

import msgpack

from engines.base.block_hash import num_blocks_for
from services.common.protos import common_pb2

VERSION = 1
MIN_KEY_BYTES = 32


class KvHandleError(Exception):
    """A KV handle a decode worker refuses before any pull or READ; `reason` is its metric label."""

    reason = "invalid"


class HandleNotTrusted(KvHandleError):
    """Not signed with this deployment's key, or naming a source that is not a registered prefill worker."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class HandleInvalid(KvHandleError):
    """Signed, but not usable for this request: expired, or for other tokens."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def parse_key(text: str) -> bytes:
    """The key in a key file's text (hex, at least MIN_KEY_BYTES bytes); ValueError otherwise."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("the KV signing key file must hold hex digits only") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"the KV signing key must be at least {MIN_KEY_BYTES} bytes ({2 * MIN_KEY_BYTES} hex "
            f"digits), got {len(key)}"
        )
    return key


def prompt_hash(token_ids) -> bytes:
    """SHA-256 of the token ids as little-endian uint32: what a handle binds its KV to."""
    tokens = array("I", token_ids)  # NOTE: 4 bytes an item on every platform tandem runs on
    if sys.byteorder == "big":
        tokens.byteswap()
    return hashlib.sha256(tokens.tobytes()).digest()


def signed_bytes(h: common_pb2.KvHandle) -> bytes:
    """The canonical bytes a signature covers: every field of the handle but the signature itself. The engine's
    params (a NIXL descriptor: agent, block ids, pool geometry) enter by their SHA-256."""
    layout = (h.layout.num_layers, h.layout.num_kv_heads, h.layout.head_dim, h.layout.dtype, h.layout.block_size)
    return msgpack.packb(
        (
            VERSION,
            h.worker_id,
            h.address,
            h.req_id,
            layout,
            h.num_tokens,
            h.num_blocks,
            float(h.lease_expires_unix_s),
            hashlib.sha256(h.engine_params).digest(),
            h.prompt_hash,
        )
    )


class KvSigner:
    """The prefill side. Without a key (plaintext dev mode) handles carry a prompt hash but no signature."""

    def __init__(self, key: bytes | None):
        self.key = key

    def seal(self, handle: common_pb2.KvHandle, token_ids) -> None:
        handle.prompt_hash = prompt_hash(token_ids[: handle.num_tokens])
        if self.key:
            handle.signature = hmac.new(self.key, signed_bytes(handle), hashlib.sha256).digest()


class ReplayGuard:
    """Handles already used, until their lease ends (a handle past its lease is refused as expired anyway)."""

    def __init__(self):
        self._seen: dict[bytes, float] = {}
        self._order: deque[tuple[float, bytes]] = deque()

    def claim(self, token: bytes, expires_unix_s: float, now: float) -> bool:
        """True the first time `token` is presented; False for a replay."""
        self._forget_before(now)
        if token in self._seen:
            return False
        self._seen[token] = expires_unix_s
        self._order.append((expires_unix_s, token))
        return True

    def _forget_before(self, now: float) -> None:
        # NOTE: leases share one TTL, so claims arrive nearly in expiry order; a stray later one waits its turn
        while self._order and self._order[0][0] < now:
            _, token = self._order.popleft()
            self._seen.pop(token, None)

    def __len__(self) -> int:
        return len(self._seen)


class KvVerifier:
    """The decode side's pure checks, in the order that costs an attacker most and this worker least: the seal
    (no I/O), the lease, the prompt; `claim` then marks the handle used."""

    def __init__(self, key: bytes | None):
        self.key = key
        self.replays = ReplayGuard()

    @property
    def is_signed(self) -> bool:
        return bool(self.key)

    def check(self, h: common_pb2.KvHandle, token_ids, now: float) -> None:
        if self.key:
            if not h.signature:
                raise HandleNotTrusted("the KV handle is not signed", "unsigned")
            expected = hmac.new(self.key, signed_bytes(h), hashlib.sha256).digest()
            if not hmac.compare_digest(expected, h.signature):
                raise HandleNotTrusted(
                    "the KV handle's signature does not verify with this deployment's key", "bad_signature"
                )
        if now > h.lease_expires_unix_s:
            raise HandleInvalid(f"the KV handle's lease ended {now - h.lease_expires_unix_s:.1f}s ago", "expired")
        if not 0 < h.num_tokens <= len(token_ids) or h.layout.block_size < 1:
            raise HandleInvalid(
                f"the KV handle covers {h.num_tokens} tokens of a {len(token_ids)}-token request", "wrong_prompt"
            )
        if h.num_blocks != num_blocks_for(h.num_tokens, h.layout.block_size):
            raise HandleInvalid(f"the KV handle names {h.num_blocks} blocks for {h.num_tokens} tokens", "wrong_prompt")
        if not hmac.compare_digest(prompt_hash(token_ids[: h.num_tokens]), h.prompt_hash):
            raise HandleInvalid("the KV handle was issued for other prompt tokens", "wrong_prompt")

    def claim(self, h: common_pb2.KvHandle, now: float) -> None:
        """Mark the handle used; HandleNotTrusted when it was used before."""
        token = h.signature or hashlib.sha256(signed_bytes(h)).digest()
        if not self.replays.claim(token, h.lease_expires_unix_s, now):
            raise HandleNotTrusted(f"the KV handle for {h.req_id!r} was already used", "replayed")
