"""Tenants at the gateway: who an API key is (a keyed digest, never the key), the cache salt a request's KV blocks
are hashed under, and each key's concurrency and token-rate limits. Pure: no I/O, the clock is passed in.

It must never log, store or send an API key: only `tenant_id`s leave this module.
"""

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.gateway.errors import RateLimitError

SHARING_MODES = ("per-key", "shared")  # TANDEM_CACHE_SHARING
MAX_CACHE_SALT_CHARS = 256  # what a client may send as cache_salt
_PERSON = b"tandem-tenant"


def tenant_id(api_key: str, secret: str = "") -> str:
    """A stable label for `api_key`: BLAKE2b keyed with the deployment secret, so the label neither reveals the key
    nor lets anyone test a guessed key offline without the secret."""
    key = hashlib.sha256(secret.encode()).digest()
    return hashlib.blake2b(api_key.encode(), key=key, digest_size=16, person=_PERSON).hexdigest()


def cache_salt(tenant: str, requested: str | None, sharing: str) -> str:
    """The salt a request's first KV block is hashed under.

    per-key: the tenant's own label, then the client's `cache_salt` if any, so no client can pick another key's salt.
    shared (a single-tenant deployment): the client's `cache_salt` alone, as vLLM treats it.
    """
    if sharing == "shared" or not tenant:
        return requested or ""
    return tenant if requested is None else f"{tenant}:{requested}"


@dataclass(slots=True)
class _Bucket:
    """A token bucket that may go negative: admission needs a positive level; what a request really used is
    charged after it ran, so an expensive request delays the key's next one instead of being refused up front."""

    level: float
    updated_s: float


@dataclass(slots=True)
class KeyLimits:
    """Per-key limits: `max_inflight` sequences at once (0: none) and `tokens_per_minute` prompt plus generated
    tokens (0: none). Keys are tenant ids; an unauthenticated gateway has one tenant, ""."""

    max_inflight: int = 0
    tokens_per_minute: int = 0
    clock: Callable[[], float] = time.monotonic
    _inflight: dict[str, int] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def acquire(self, tenant: str, num_seqs: int = 1) -> None:
        """Take `num_seqs` of the key's slots, or raise RateLimitError (429 with Retry-After) and take none."""
        self._check_rate(tenant)
        held = self._inflight.get(tenant, 0)
        if self.max_inflight and held + num_seqs > self.max_inflight:
            raise RateLimitError(
                f"This API key has {held} sequences in flight; its limit is {self.max_inflight} "
                f"(a request takes one per choice, n={num_seqs}). Retry shortly.",
                code="key_concurrency_exceeded",
            )
        self._inflight[tenant] = held + num_seqs

    def release(self, tenant: str, num_seqs: int = 1) -> None:
        held = self._inflight.get(tenant, 0) - num_seqs
        if held > 0:
            self._inflight[tenant] = held
        else:
            self._inflight.pop(tenant, None)

    def charge(self, tenant: str, num_tokens: int) -> None:
        """Spend `num_tokens` of the key's token rate (prompt tokens at admission, generated ones at the end)."""
        if self.tokens_per_minute and num_tokens > 0:
            self._refilled(tenant).level -= num_tokens

    def num_inflight(self, tenant: str) -> int:
        return self._inflight.get(tenant, 0)

    def _check_rate(self, tenant: str) -> None:
        if not self.tokens_per_minute:
            return
        bucket = self._refilled(tenant)
        if bucket.level <= 0:
            exc = RateLimitError(
                f"This API key is over its limit of {self.tokens_per_minute} tokens per minute.",
                code="key_token_rate_exceeded",
            )
            exc.retry_after_s = max(1, math.ceil((1 - bucket.level) / self._rate_per_s))
            raise exc

    @property
    def _rate_per_s(self) -> float:
        return self.tokens_per_minute / 60.0

    def _refilled(self, tenant: str) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(self.tokens_per_minute), now)
        bucket.level = min(float(self.tokens_per_minute), bucket.level + (now - bucket.updated_s) * self._rate_per_s)
        bucket.updated_s = now
        return bucket
