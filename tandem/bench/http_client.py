"""The benchmark's HTTP side: one shared httpx.AsyncClient (keep-alive pool) streaming /v1/completions
with token-id prompts, each SSE line stamped on arrival. Turns HTTP into RequestRecords; no statistics."""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tandem.bench.loadgen import PromptMaker, RequestSpec
from tandem.bench.serve_stats import RequestRecord
from tandem.bench.sse import EventKind, parse_sse_line

COMPLETIONS_PATH = "/v1/completions"


class ServerError(RuntimeError):
    """The server cannot be benchmarked: unreachable, or no model listed."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    base_url: str  # e.g. http://127.0.0.1:8000, without /v1
    model: str = ""  # "" = the first model /v1/models lists
    api_key: str | None = None
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)  # server extensions, e.g. {"ignore_eos": true} for vLLM
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class ModelCard:
    id: str
    max_model_len: int | None  # None when the server does not say


class StreamingClient:
    """Use as `async with StreamingClient(...) as client`; `client.send` is a loadgen.Send.

    A chunk stamps a token arrival when it carries text or a finish reason (chunks without either, such as
    a chat stream's role-only first chunk, do not count); ITLs are gaps between such chunks."""

    def __init__(
        self,
        endpoint: Endpoint,
        prompts: PromptMaker,
        max_connections: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.endpoint, self.prompts, self.clock = endpoint, prompts, clock
        logging.getLogger("httpx").setLevel(logging.WARNING)  # NOTE: it logs every request at INFO
        self.model = endpoint.model
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(
            base_url=endpoint.base_url.rstrip("/"),
            headers=headers,
            limits=limits,
            timeout=httpx.Timeout(endpoint.timeout_s, connect=10.0),
            transport=transport,
        )

    async def __aenter__(self) -> "StreamingClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    async def model_card(self) -> ModelCard:
        """The served model (the one named in `endpoint.model`, else the first listed) and its context."""
        try:
            reply = await self.http.get("/v1/models")
            reply.raise_for_status()
            cards = reply.json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise ServerError(f"cannot list models at {self.endpoint.base_url}/v1/models: {exc}") from None
        card = next((c for c in cards if c.get("id") == self.model), cards[0] if cards else None)
        if card is None:
            raise ServerError(f"{self.endpoint.base_url}/v1/models lists no model")
        self.model = self.model or card["id"]
        return ModelCard(card["id"], card.get("max_model_len"))

    def body(self, spec: RequestSpec) -> bytes:
        payload = {
            "model": self.model,
            "prompt": self.prompts.prompt(spec),
            "max_tokens": spec.osl,
            "temperature": self.endpoint.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.endpoint.extra_body,
        }
        return json.dumps(payload).encode()

    async def send(self, spec: RequestSpec) -> RequestRecord:
        content = self.body(spec)  # NOTE: built before the clock starts, as the in-process run does
        record = RequestRecord(submit_s=self.clock(), num_prompt_tokens=spec.isl)
        try:
            async with self.http.stream(
                "POST", COMPLETIONS_PATH, content=content, headers={"Content-Type": "application/json"}
            ) as reply:
                if reply.status_code != 200:
                    text = (await reply.aread()).decode(errors="replace")
                    record.error = f"HTTP {reply.status_code}: {text[:300]}"
                else:
                    await self._consume(reply, record)
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        record.end_s = self.clock()
        return record

    async def _consume(self, reply: httpx.Response, record: RequestRecord) -> None:
        recorder = SseRecorder(record)
        async for line in reply.aiter_lines():
            recorder.line(line, self.clock())
        recorder.finish()


class SseRecorder:
    """Turns one response's SSE lines into its RequestRecord: chunk stamps, an error event, the usage."""

    def __init__(self, record: RequestRecord):
        self.record, self._usage = record, None

    def line(self, line: str, now: float) -> None:
        event = parse_sse_line(line)
        # NOTE: a chunk with text, or the last one (its token may decode to no text); not a role-only opener
        if event.kind is EventKind.CONTENT and (event.text or event.finish_reason):
            self.record.chunk_times_s.append(now)
            self.record.text += event.text
        elif event.kind is EventKind.ERROR:
            self.record.error = event.error
        if event.num_completion_tokens is not None:
            self._usage = event.num_completion_tokens

    def finish(self) -> None:
        self.record.num_output_tokens = self._usage if self._usage is not None else len(self.record.chunk_times_s)
