"""Admission control before any work starts: API keys, the request body limit, each key's limits (tenancy.py),
and the in-flight limit, which holds across every gateway process on one port (SharedInflight); a request takes one
slot per choice (`n`).

Raises typed errors only; errors.py turns them into 401/413/429.
"""

import hmac
from collections.abc import Callable
from typing import Protocol

from starlette.requests import Request

from services.gateway.errors import AuthenticationError, InvalidRequestError, RateLimitError, RequestTooLargeError
from services.gateway.tenancy import KeyLimits, tenant_id


class Inflight(Protocol):
    """Requests in flight against one limit: `try_acquire` counts one more unless the limit is reached."""

    def try_acquire(self, num: int = 1) -> bool: ...

    def release(self, num: int = 1) -> None: ...

    def count(self) -> int: ...


class LocalInflight:
    """One process's count."""

    def __init__(self, max_inflight: int):
        self.max_inflight, self._num = max_inflight, 0

    def try_acquire(self, num: int = 1) -> bool:
        if self._num + num > self.max_inflight:
            return False
        self._num += num
        return True

    def release(self, num: int = 1) -> None:
        self._num -= num

    def count(self) -> int:
        return self._num


class SharedInflight:
    """The count of N processes, one slot each in shared memory (a multiprocessing Array made by the supervisor);
    a slot is this process's own count, so the supervisor can zero a dead process's slot. The check and the
    increment happen under the array's lock: the sum never exceeds the limit."""

    def __init__(self, slots, index: int, max_inflight: int):
        self._slots, self._index, self.max_inflight = slots, index, max_inflight

    def try_acquire(self, num: int = 1) -> bool:
        with self._slots.get_lock():
            if sum(self._slots) + num > self.max_inflight:
                return False
            self._slots[self._index] += num
            return True

    def release(self, num: int = 1) -> None:
        with self._slots.get_lock():
            self._slots[self._index] -= num

    def count(self) -> int:
        return sum(self._slots)


class Admission:
    def __init__(
        self,
        *,
        max_inflight: int,
        api_keys: tuple[str, ...] = (),
        inflight: Inflight | None = None,
        limits: KeyLimits | None = None,
        secret: str = "",
    ):
        self.max_inflight = max_inflight
        self.inflight = inflight or LocalInflight(max_inflight)
        self.limits = limits or KeyLimits()
        self._keys = tuple(k.encode() for k in api_keys)
        self._tenants = tuple(tenant_id(k, secret) for k in api_keys)  # NOTE: computed once; keys never leave here

    @property
    def num_inflight(self) -> int:
        return self.inflight.count()

    def check_key(self, authorization: str | None) -> str:
        """With keys configured, the request must carry one as `Authorization: Bearer KEY`; returns its tenant id
        ("" without keys)."""
        if not self._keys:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("Missing API key: send `Authorization: Bearer YOUR_KEY`.")
        given = token.strip().encode()
        # NOTE: compare against every key, in constant time, so timing reveals nothing
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if not any(matches):
            raise AuthenticationError("Incorrect API key provided.")
        return self._tenants[matches.index(True)]

    def acquire(self, tenant: str = "", num_seqs: int = 1) -> "Slot":
        """`num_seqs` slots of the key's limits and of the gateway's, or a 429 that takes none. Without API keys
        (tenant "") there is no key to limit: the gateway's own limit alone applies."""
        if not tenant:
            if not self.inflight.try_acquire(num_seqs):
                raise self._full(num_seqs)
            return Slot([lambda: self.inflight.release(num_seqs)])
        self.limits.acquire(tenant, num_seqs)
        if not self.inflight.try_acquire(num_seqs):
            self.limits.release(tenant, num_seqs)
            raise self._full(num_seqs)
        return Slot([lambda: self.inflight.release(num_seqs), lambda: self.limits.release(tenant, num_seqs)])

    def _full(self, num_seqs: int) -> RateLimitError:
        return RateLimitError(
            f"This gateway is serving its limit of {self.max_inflight} sequences (n={num_seqs} asked); retry shortly."
        )


class Slot:
    """One admitted request; release() is idempotent so every exit path may call it. `on_release` runs first (e.g.
    charging the tokens the request generated to its key)."""

    def __init__(self, releases: list[Callable[[], None]]):
        self._releases = releases
        self.on_release: Callable[[], None] | None = None

    def release(self) -> None:
        releases, self._releases = self._releases, []
        if releases and self.on_release is not None:
            self.on_release()
        for release in releases:
            release()


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `max_bytes` (before any parsing)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequestError("invalid Content-Length header")
        if int(declared) > max_bytes:
            raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, max_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(f"The request body ({size} bytes) exceeds this server's limit of {max_bytes} bytes.")
