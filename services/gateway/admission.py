"""Admission control before any work starts: API keys, the request body limit, the in-flight limit.

Raises typed errors only; errors.py turns them into 401/413/429.
"""
import hmac

from starlette.requests import Request

from services.gateway.errors import AuthenticationError, InvalidRequestError, RateLimitError, RequestTooLargeError


class Admission:
    def __init__(self, *, max_inflight: int, api_keys: tuple[str, ...] = ()):
        self.max_inflight = max_inflight
        self.num_inflight = 0
        self._keys = tuple(k.encode() for k in api_keys)

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
        if self.num_inflight >= self.max_inflight:
            raise RateLimitError(f"This gateway is serving its limit of {self.max_inflight} requests; retry shortly.")
        self.num_inflight += 1
        return Slot(self)


class Slot:
    """One admitted request; release() is idempotent so every exit path may call it."""

    def __init__(self, admission: Admission):
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission.num_inflight -= 1
            self._admission = None


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
