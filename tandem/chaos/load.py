"""The chaos load: closed-loop clients (each sends its next request when its last one ends, and waits out a
Retry-After as a well-behaved client does) for a scenario's duration, plus bursts the faults add. Every request
asks for exactly `osl` tokens of one of a few fixed prompts, so each answer can be checked against its reference.

Sends and records; judging is outcomes.py's.
"""

import asyncio
import itertools
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from tandem.chaos.client import NORMAL, Behaviour, Exchange, Record, completion_body

BASE_TOKEN = 1000  # prompt ids above every tokenizer's specials


@dataclass(frozen=True, slots=True)
class Load:
    concurrency: int
    duration_s: float
    isl: int = 128
    osl: int = 64
    num_prompts: int = 8
    deadline_s: float = 90.0  # a request with no end by then is lost (a hang)
    extra: tuple[tuple[int, Behaviour], ...] = ()  # more closed-loop clients that behave otherwise
    api_keys: tuple[str, ...] = ()  # client i sends with key i % len (none: no Authorization header)


def prompts(num: int, isl: int) -> list[list[int]]:
    """`num` prompts of `isl` tokens that share no prefix."""
    return [[BASE_TOKEN + (p * 977 + j * 13) % 20000 for j in range(isl)] for p in range(num)]


class LoadRunner:
    def __init__(self, url: str, model: str, load: Load):
        parts = urlsplit(url)
        self.host, self.port, self.model, self.load = parts.hostname, parts.port, model, load
        self.prompts = prompts(load.num_prompts, load.isl)
        self.records: list[tuple[Record, int]] = []  # (record, prompt index)
        self._counter = itertools.count()
        self._bursts: list[asyncio.Task] = []

    async def reference(self) -> list[str]:
        """Each prompt's text, asked once before any fault: what every later answer must equal."""
        records = await asyncio.gather(*(self.send(i, NORMAL, keep=False) for i in range(len(self.prompts))))
        for i, rec in enumerate(records):
            if not (rec.status == 200 and rec.is_done and rec.num_tokens == self.load.osl):
                raise RuntimeError(
                    f"the reference request for prompt {i} failed: status {rec.status}, "
                    f"{rec.error or rec.transport_error or 'no [DONE]'}"
                )
        return [rec.text for rec in records]

    async def run(self, t0: float) -> None:
        """Every client until `duration_s` after `t0`; then the bursts' stragglers."""
        clients = [NORMAL] * self.load.concurrency + [b for n, b in self.load.extra for _ in range(n)]
        await asyncio.gather(*(self._client(i, b, t0 + self.load.duration_s) for i, b in enumerate(clients)))
        if self._bursts:
            await asyncio.gather(*self._bursts)

    def burst(self, n: int, behaviour: Behaviour) -> None:
        """`n` requests at once, now, besides the closed loop (e.g. a storm of clients that hang up)."""
        self._bursts += [asyncio.create_task(self.send(i % len(self.prompts), behaviour)) for i in range(n)]

    async def _client(self, slot: int, behaviour: Behaviour, end_s: float) -> None:
        for k in itertools.count():
            if time.monotonic() >= end_s:
                return
            rec = await self.send((slot + k) % len(self.prompts), behaviour, key=self._key(slot))
            if rec.status in (429, 503) and rec.retry_after:
                await asyncio.sleep(min(float(rec.retry_after), max(end_s - time.monotonic(), 0)))

    def _key(self, slot: int) -> str:
        keys = self.load.api_keys
        return keys[slot % len(keys)] if keys else ""

    async def send(self, prompt_index: int, behaviour: Behaviour, keep: bool = True, key: str | None = None) -> Record:
        rec = Record(next(self._counter), behaviour.kind, time.monotonic())
        body = completion_body(self.model, self.prompts[prompt_index], self.load.osl)
        key = self._key(prompt_index) if key is None else key
        await Exchange(self.host, self.port, body, behaviour, rec, api_key=key).run(self.load.deadline_s)
        if keep:
            self.records.append((rec, prompt_index))
        return rec
