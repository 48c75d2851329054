"""Lease bookkeeping for KV held by a prefill worker: when each expires, in wall-clock terms
for the KvHandle. The engine frees the blocks itself when its own timer runs out."""

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Leases:
    ttl_s: float
    expiries: dict[str, float] = field(default_factory=dict)  # req_id -> unix time

    def grant(self, req_id: str, now: float | None = None) -> float:
        expires = (time.time() if now is None else now) + self.ttl_s
        self.expiries[req_id] = expires
        self._sweep(now)
        return expires

    def take(self, req_id: str) -> None:
        self.expiries.pop(req_id, None)

    def _sweep(self, now: float | None) -> None:
        now = time.time() if now is None else now
        for req_id in [r for r, t in self.expiries.items() if t < now]:
            del self.expiries[req_id]
