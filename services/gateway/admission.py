"""Admission control before any work starts: API keys, the request body limit, the in-flight limit, which holds
across every gateway process on one port (SharedInflight).

Raises typed errors only; errors.py turns them into 401/413/429.
"""
import hmac
from typing import Protocol

from starlette.requests import Request

from services.gateway.errors import AuthenticationError, InvalidRequestError, RateLimitError, RequestTooLargeError


class Inflight(Protocol):
    """Requests in flight against one limit: `try_acquire` counts one more unless the limit is reached."""

    def try_acquire(self) -> bool: ...

    def release(self) -> None: ...

    def count(self) -> int: ...


class LocalInflight:
    """One process's count."""

    def __init__(self, max_inflight: int):
        self.max_inflight, self._num = max_inflight, 0

    def try_acquire(self) -> bool:
        if self._num >= self.max_inflight:
            return False
        self._num += 1
        return True

    def release(self) -> None:
        self._num -= 1

    def count(self) -> int:
        return self._num


class SharedInflight:
    """The count of N processes, one slot each in shared memory (a multiprocessing Array made by the supervisor);
    a slot is this process's own count, so the supervisor can zero a dead process's slot. The check and the
    increment happen under the array's lock: the sum never exceeds the limit."""

    def __init__(self, slots, index: int, max_inflight: int):
        self._slots, self._index, self.max_inflight = slots, index, max_inflight

    def try_acquire(self) -> bool:
        with self._slots.get_lock():
            if sum(self._slots) >= self.max_inflight:
                return False
            self._slots[self._index] += 1
            return True

    def release(self) -> None:
        with self._slots.get_lock():
            self._slots[self._index] -= 1

    def count(self) -> int:
        return sum(self._slots)


class Admission:
    def __init__(self, *, max_inflight: int, api_keys: tuple[str, ...] = (), inflight: Inflight | None = None):
        self.max_inflight = max_inflight
        self.inflight = inflight or LocalInflight(max_inflight)
        self._keys = tuple(k.encode() for k in api_keys)

    @property
    def num_inflight(self) -> int:
        return self.inflight.count()

    def check_key(self, authorization: str | None) -> None:
        """With keys configured, the request must carry one as `Authorization: Bearer KEY`."""
        if not self._keys:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("Missing API key: send `Authorization: Bearer YOUR_KEY`.")
        given = token.strip().encode()
        # NOTE: compare against every key, in constant time, so timing reveals nothing
        if not any([hmac.compare_digest(given, key) for key in self._keys]):
            raise AuthenticationError("Incorrect API key provided.")

    def acquire(self) -> "Slot":
        if not self.inflight.try_acquire():
            raise RateLimitError(f"This gateway is serving its limit of {self.max_inflight} requests; retry shortly.")
        return Slot(self.inflight)


class Slot:
    """One admitted request; release() is idempotent so every exit path may call it."""

    def __init__(self, inflight: Inflight):
        self._inflight: Inflight | None = inflight

    def release(self) -> None:
        if self._inflight is not None:
            self._inflight.release()
            self._inflight = None


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
