"""One completion request from body to response: admit, validate, template and tokenize, run the choices,
answer whole or as SSE. Every exit path records metrics once, frees the in-flight slot and stops the work."""

import asyncio
import dataclasses
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engines.base.grammar import grammar_text
from services.common.logs import request_id as current_request_id
from services.common.tracing import span
from services.gateway import errors
from services.gateway.admission import Admission, Slot, read_body
from services.gateway.chat_plan import ChatPlan, plan_chat, split_deltas
from services.gateway.choices import ChoiceDelta, Job, run_job
from services.gateway.detokenizer import TokenBytes
from services.gateway.metrics import GatewayMetrics, RequestTimer
from services.gateway.model_info import ModelInfo
from services.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest, parse_request
from services.gateway.pipeline import Pipeline
from services.gateway.responses import ChatFormat, ChoiceTotal, CompletionFormat
from services.gateway.settings import GatewaySettings
from services.gateway.sse import SseResponse
from services.gateway.tenancy import cache_salt
from services.gateway.tool_parsers import parser_for

log = logging.getLogger(__name__)
REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
T = TypeVar("T")
A = TypeVar("A")


class Serving:
    def __init__(self, settings: GatewaySettings, model: ModelInfo, admission: Admission, metrics: GatewayMetrics):
        self.settings, self.model, self.admission, self.metrics = settings, model, admission, metrics
        self.token_bytes = TokenBytes(model.tokenizer)
        self.tool_parser = parser_for(settings.tool_parser, model.tokenizer.chat_template)
        self.pipeline: Pipeline | None = None  # set once the router channel exists
        # NOTE: one thread: prompts are tokenized off the event loop, never two at once on one tokenizer
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def close(self) -> None:
        if self.pipeline is not None:
            await self.pipeline.close()
        self._tokenizing.shutdown(wait=False, cancel_futures=True)

    async def max_model_len(self) -> int:
        """The engines' context, as their workers report it to the router."""
        if self.pipeline is None:
            raise errors.NoWorkerError("the gateway is not connected to a router yet")
        return await self.pipeline.max_model_len()

    def check_model(self, name: str) -> None:
        if name != self.model.name:
            raise errors.ModelNotFoundError(
                f"The model `{name}` does not exist; this server serves `{self.model.name}`.", param="model"
            )

    async def handle(
        self,
        request: Request,
        route: str,
        kind: type[ChatCompletionRequest | CompletionRequest],
        response_id: str | None = None,
    ) -> Response:
        """`response_id`: the id of what the client gets (the Responses API's resp_...), for the logs and the
        workers' request ids; by default the completion's own."""
        timer = self.metrics.start(route, self.model.name)
        slot: Slot | None = None
        try:
            tenant = self.admission.check_key(request.headers.get("authorization"))
            req = parse_request(kind, await read_body(request, self.settings.max_body_bytes))
            self.check_model(req.model)
            slot = self.admission.acquire(tenant, _num_choices(req))  # NOTE: one slot per choice: n=16 takes 16
            header = request.headers.get(REQUEST_ID_HEADER)
            is_unique = header is None or response_id is not None
            response_id = response_id or _response_id(req, header)
            timer.request_id = response_id
            current_request_id.set(response_id)  # NOTE: this request's task only; tags its log records
            # NOTE: two clients may send one x-request-id: the workers' ids get a random part so they never collide
            job, plan = await self._job(
                req, response_id if is_unique else f"{response_id}-{uuid.uuid4().hex[:8]}", tenant
            )
            timer.num_prompt_tokens = job.num_prompt_tokens
            self._charge(slot, tenant, job, timer)
            fmt = (ChatFormat if kind is ChatCompletionRequest else CompletionFormat)(
                response_id, self.model.name, self.token_bytes, req.num_top_logprobs() is not None
            )
            if req.stream:
                usage = _UsageIn(req.include_usage(), req.include_continuous_usage(), job.num_prompt_tokens)
                return await self._stream(request, job, fmt, timer, slot, usage, plan)
            response = await self._whole(request, job, fmt, timer, plan)
            timer.finish(200)
            return response
        except BaseException as exc:
            timer.finish(errors.status_of(exc))
            raise
        finally:
            if slot is not None and timer.is_finished:
                slot.release()

    def _charge(self, slot: Slot, tenant: str, job: Job, timer: RequestTimer) -> None:
        """The key's token rate pays each choice's prompt now and the generated tokens when the slot is freed (no key,
        no rate: without API keys only the gateway's own limit applies)."""
        if not tenant:
            return
        limits = self.admission.limits
        limits.charge(tenant, job.num_prompt_tokens * job.n)
        slot.on_release = lambda: limits.charge(tenant, timer.num_completion_tokens)

    async def _job(
        self, req: ChatCompletionRequest | CompletionRequest, request_id: str, tenant: str = ""
    ) -> tuple[Job, ChatPlan | None]:
        plan, max_chars = None, self.settings.max_prompt_chars
        with span("tokenize") as current:
            if isinstance(req, ChatCompletionRequest):
                param = "messages"
                plan = plan_chat(
                    req, self.model.tokenizer.chat_template, self.tool_parser, self.settings.reasoning_parser == "think"
                )
                prompts = [await self._off_loop(self.model.chat_prompt, plan.messages, plan.tools, max_chars)]
            else:
                param = "prompt"
                prompts = [
                    p if isinstance(p, list) else await self._off_loop(self.model.text_prompt, p, max_chars)
                    for p in req.prompts()
                ]
            current.set_attribute("tandem.prompt_tokens", sum(map(len, prompts)))
        limit = await self.max_model_len()
        for prompt in prompts:
            self.model.check_prompt(prompt, param, limit)
        # NOTE: a batch shares its sampling parameters: the longest prompt bounds max_tokens for all
        max_tokens = self.model.max_new_tokens(
            max(map(len, prompts)), req.requested_max_tokens(), limit, req.max_tokens_param()
        )
        params = dataclasses.replace(
            req.sampling_params(max_tokens), cache_salt=cache_salt(tenant, req.cache_salt, self.settings.cache_sharing)
        )
        self.model.check_logit_bias(params.logit_bias)
        spec = plan.spec if plan is not None else req.format_spec()
        if spec is not None:
            if plan is None:
                grammar_text(spec)  # NOTE: compiles it once here: a grammar that does not compile is the client's 400
            params = dataclasses.replace(params, structured=spec)
        log.debug(
            "%s: %d prompts, %d prompt tokens, n=%d, user=%s",
            request_id,
            len(prompts),
            sum(map(len, prompts)),
            req.n,
            req.user,
        )
        return Job(request_id, tuple(prompts), params, req.n, req.stop_strings()), plan

    async def _off_loop(self, fn: Callable[..., list[int]], *args) -> list[int]:
        # NOTE: templating and tokenizing run in the one tokenizer thread: a long prompt never stalls the loop
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, fn, *args)

    def _deltas(self, job: Job, timer: RequestTimer, plan: ChatPlan | None = None) -> AsyncIterator[ChoiceDelta]:
        if self.pipeline is None:
            raise errors.NoWorkerError("the gateway is not connected to a router yet")
        deltas = run_job(self.pipeline, self.model.tokenizer, job, timer.on_tokens)
        if plan is None or not plan.splits:
            return deltas
        return split_deltas(deltas, plan, self.model.tokenizer.decode(job.prompt[-8:]))

    async def _whole(
        self, request: Request, job: Job, fmt, timer: RequestTimer, plan: ChatPlan | None = None
    ) -> Response:
        totals = [ChoiceTotal(i) for i in range(job.num_choices)]

        async def collect() -> None:
            async with aclosing(self._deltas(job, timer, plan)) as deltas:
                async for delta in deltas:
                    totals[delta.index].add(delta)
                    timer.on_cached_tokens(delta.num_cached_tokens)

        await until_disconnected(request, collect())
        return JSONResponse(
            fmt.whole(totals, job.num_prompt_tokens, timer.num_completion_tokens, timer.num_cached_tokens)
        )

    async def _stream(
        self,
        request: Request,
        job: Job,
        fmt,
        timer: RequestTimer,
        slot: Slot,
        usage: "_UsageIn",
        plan: ChatPlan | None = None,
    ) -> Response:
        """Wait for the first token before answering, so failures up to there keep their HTTP status."""
        deltas = self._deltas(job, timer, plan)
        try:
            first = await until_disconnected(request, anext(deltas))
        except BaseException:
            await deltas.aclose()
            raise
        events = _events(first, deltas, fmt, timer, slot, usage)

        async def on_close() -> None:
            await events.aclose()
            await deltas.aclose()
            timer.finish(errors.CLIENT_CLOSED_STATUS)  # a no-op unless the stream never got to finish
            slot.release()

        return SseResponse(events, on_close)


@dataclass(frozen=True, slots=True)
class _UsageIn:
    """Where a stream reports usage: a last chunk (include_usage) and/or every chunk (continuous_usage_stats)."""

    at_end: bool
    in_every_chunk: bool
    num_prompt_tokens: int


def _num_choices(req: ChatCompletionRequest | CompletionRequest) -> int:
    """Choices the request asks for: n per prompt (a completions request may send several prompts)."""
    return req.n * (len(req.prompts()) if isinstance(req, CompletionRequest) else 1)


def _response_id(req: ChatCompletionRequest | CompletionRequest, header: str | None) -> str:
    """The response's id (and the logs' request id): the client's x-request-id when it sent one."""
    prefix = "chatcmpl" if isinstance(req, ChatCompletionRequest) else "cmpl"
    if header is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not REQUEST_ID.fullmatch(header):
        raise errors.InvalidRequestError(
            f"the {REQUEST_ID_HEADER} header takes 1-128 characters of [A-Za-z0-9._:-]", param=REQUEST_ID_HEADER
        )
    return f"{prefix}-{header}"


async def _events(
    first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta], fmt, timer: RequestTimer, slot: Slot, usage: _UsageIn
) -> AsyncIterator[bytes]:
    """SSE `data:` payloads; a failure after the first byte becomes one error event, then the end."""
    status, started = 200, set()
    try:
        async with aclosing(deltas):
            data = _chunk(fmt, first, started, timer, usage)
            if data is not None:
                yield data
            async for delta in deltas:
                data = _chunk(fmt, delta, started, timer, usage)
                if data is not None:
                    yield data
        if usage.at_end:
            yield json.dumps(
                fmt.usage_chunk(usage.num_prompt_tokens, timer.num_completion_tokens, timer.num_cached_tokens)
            ).encode()
        yield b"[DONE]"
    except (errors.GatewayError, errors.EngineError) as exc:
        status = errors.status_of(exc)
        log.warning("%s failed mid-stream: %s", fmt.request_id, exc)
        yield errors.sse_error_data(exc).encode()
    except (asyncio.CancelledError, GeneratorExit):  # NOTE: closed at a yield: the client left while we wrote
        status = errors.CLIENT_CLOSED_STATUS
        raise
    except Exception as exc:  # a bug must still end the stream cleanly, never hang the client
        status = errors.status_of(exc)
        log.exception("%s failed mid-stream", fmt.request_id)
        yield errors.sse_error_data(exc).encode()
    finally:
        timer.finish(status)
        slot.release()


def _chunk(fmt, delta: ChoiceDelta, started: set[int], timer: RequestTimer, usage: _UsageIn) -> bytes | None:
    """A delta's chunk; None for one that says nothing (no text, no logprobs, not a choice's first or last)."""
    is_first = delta.index not in started
    if is_first:
        started.add(delta.index)
        timer.on_cached_tokens(delta.num_cached_tokens)
    elif not (delta.text or delta.logprobs or delta.finish_reason or getattr(delta, "part", None)):
        return None
    if usage.in_every_chunk:  # NOTE: vLLM's shape: the usage so far rides on each content chunk
        totals = fmt.usage_chunk(usage.num_prompt_tokens, timer.num_completion_tokens, timer.num_cached_tokens)
        return json.dumps(fmt.chunk(delta, is_first) | {"usage": totals["usage"]}).encode()
    return fmt.chunk_json(delta, is_first).encode()


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and raising ClientDisconnected) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # NOTE: its cleanup (aborting workers) must run before we go on
    if task.cancelled():
        raise errors.ClientDisconnected()
    return task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
