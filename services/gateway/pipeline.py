"""The request path over gRPC: Route, then Prefill on a prefill worker and Generate with its KV handle on the
decode worker, or Generate alone; a worker failing mid-stream hands the request to another (journey.py). Yields
token deltas; a cancelled or closed stream aborts the work it started. Knows nothing of HTTP, text or OpenAI, nor of
protobuf: it speaks domain types to RouterPool and WorkerClients, which hold the stubs."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing

import grpc

from engines.base.block_hash import chain_block_hashes, chain_root
from engines.base.types import FinishReason, SamplingParams
from services.common.domain import FailureReport, ListedWorker, Prefilled, Route, RouteRequest, TokenDelta
from services.common.errors import detail_of
from services.common.roles import WorkerRole
from services.common.tracing import span
from services.gateway import errors
from services.gateway.journey import Journey
from services.gateway.router_pool import RouterPool
from services.gateway.worker_clients import TokenStream, WorkerClients

log = logging.getLogger(__name__)
# a prefill worker failing any other way is skipped: the decode worker prefills locally instead
NO_FALLBACK_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})
CLEANUP_TIMEOUT_S = 5.0
READMIT_PAUSE_S = 0.25  # before going back to a worker that failed the request: above gRPC's reconnect backoff
WORKER_LIST_TTL_S = 5.0  # how long the router's worker list (the engines' context length) is trusted


class Pipeline:
    def __init__(
        self,
        router_channel: grpc.aio.Channel | list[grpc.aio.Channel] | RouterPool,
        *,
        model: str,
        request_timeout_s: float,
        route_timeout_s: float,
        max_migrations: int = 3,
        on_migration: Callable[[], None] = lambda: None,
        kv_hash_secret: str = "",
    ):
        self._routers = (
            router_channel
            if isinstance(router_channel, RouterPool)
            else RouterPool(router_channel if isinstance(router_channel, list) else [router_channel])
        )
        self._model = model
        self._max_migrations, self._on_migration = max_migrations, on_migration
        self._request_timeout_s, self._route_timeout_s = request_timeout_s, route_timeout_s
        self._workers = WorkerClients()
        self._background: set[asyncio.Task] = set()
        self._max_model_len, self._listed_at = 0, -WORKER_LIST_TTL_S
        self._block_size = 0  # the decode workers' one KV block size (0: unknown or mixed): the router's hashes
        self._kv_hash_secret = kv_hash_secret  # keys the hashes' root, as the router and workers do

    async def generate(self, req_id: str, prompt: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta]:
        """One request, start to finish, across as many workers as it takes; Router.Complete follows whatever
        happens. A worker that fails it is reported to the router at once: before the first token the request is
        routed around it, after that it migrates (prompt + tokens so far, up to `max_migrations` times): the
        client's stream goes on with no gap and no repeat."""
        journey = Journey(self._max_migrations)
        try:
            while True:
                route = await self._route_journey(req_id, prompt, params, journey)
                try:
                    async with aclosing(self._attempt(route, req_id, prompt, params, journey)) as stream:
                        async for delta in stream:
                            journey.record(delta.token_ids)
                            yield delta
                    return
                except errors.WorkerFailedError as exc:
                    self._spawn(self._report(route.decode.worker_id, req_id, str(exc)))
                    if not journey.may_continue(route.decode.worker_id):
                        raise
                    self._log_failover(req_id, route.decode.worker_id, journey, exc)
        finally:
            self._spawn(self._complete(req_id))

    async def _route_journey(self, req_id: str, prompt: list[int], params: SamplingParams, journey: Journey) -> Route:
        """Route around the workers that failed it; when none is left but those, go back to them once, after a
        pause in which a dropped connection is dialled again."""
        tokens = journey.route_tokens(prompt)
        try:
            return await self._route(req_id, tokens, journey.excluded, params.cache_salt)
        except errors.NoWorkerError as exc:  # NOTE: not when the others are busy: that one is the client's to retry
            if isinstance(exc, errors.AllWorkersBusyError) or not journey.readmit():
                raise
        log.warning("no other worker for %s: trying again the worker that failed it", req_id)
        await asyncio.sleep(READMIT_PAUSE_S)
        return await self._route(req_id, tokens, journey.excluded, params.cache_salt)

    def _attempt(
        self, route: Route, req_id: str, prompt: list[int], params: SamplingParams, journey: Journey
    ) -> AsyncIterator[TokenDelta]:
        if journey.is_started:  # NOTE: a migration: the decode worker prefills prompt + output itself
            return self._resume(route.decode.address, req_id, prompt, params, journey.output_token_ids)
        if route.prefill is not None:
            return self._disaggregated(route, req_id, prompt, params)
        return self._generate(route.decode.address, req_id, prompt, params)

    async def _resume(
        self, address: str, req_id: str, prompt: list[int], params: SamplingParams, output_token_ids: list[int]
    ) -> AsyncIterator[TokenDelta]:
        if len(output_token_ids) >= params.max_tokens:  # it broke after its last token, before saying so
            yield TokenDelta((), finish_reason=FinishReason.LENGTH)
            return
        call = self._start_generate(address, req_id, prompt, params, output_token_ids=output_token_ids)
        async with aclosing(self._stream(address, req_id, call)) as stream:
            async for delta in stream:
                yield delta

    def _log_failover(self, req_id: str, worker_id: str, journey: Journey, exc: Exception) -> None:
        if journey.is_started:
            self._on_migration()
            log.warning(
                "worker %s failed %s after %d tokens (%s); migrating it (%d of %d)",
                worker_id,
                req_id,
                len(journey.output_token_ids),
                exc,
                journey.num_migrations,
                self._max_migrations,
            )
        else:
            log.warning("worker %s failed %s before its first token (%s); routing again", worker_id, req_id, exc)

    async def is_ready(self) -> tuple[bool, str]:
        """True when the router answers and lists at least one live decode worker."""
        try:
            listing = await self._list_workers()
        except grpc.aio.AioRpcError as exc:
            return False, f"router unreachable: {exc.code().name}"
        live = [w for w in listing if w.role is WorkerRole.DECODE and w.is_live]
        return (True, f"{len(live)} decode workers") if live else (False, "no live decode worker")

    async def max_model_len(self) -> int:
        """The context length the model's live workers report (the smallest); raises NoWorkerError while none
        says. Read from the router's worker list at most every WORKER_LIST_TTL_S."""
        if time.monotonic() - self._listed_at >= WORKER_LIST_TTL_S or not self._max_model_len:
            try:
                await self._list_workers()
            except grpc.aio.AioRpcError as exc:
                raise errors.from_rpc_error(exc, "route") from None
        if not self._max_model_len:
            raise errors.NoWorkerError("no live worker reports this model's context length yet")
        return self._max_model_len

    async def _list_workers(self) -> list[ListedWorker]:
        listing = await self._routers.list_workers(self._route_timeout_s)
        lengths = [w.max_model_len for w in listing if w.model == self._model and w.is_live and w.max_model_len]
        if lengths:  # NOTE: none listed says nothing new: the last known context stands
            self._max_model_len = min(lengths)
        sizes = {w.block_size for w in listing if w.model == self._model and w.role is WorkerRole.DECODE and w.is_live}
        if sizes:
            self._block_size = sizes.pop() if len(sizes) == 1 else 0
        self._listed_at = time.monotonic()
        return listing

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=CLEANUP_TIMEOUT_S)
        await self._workers.close()

    async def _route(self, req_id: str, prompt: list[int], excluded: list[str], salt: str = "") -> Route:
        # NOTE: the prompt's block hashes go along once the workers' block size is known: the router skips hashing
        root = chain_root(salt, self._kv_hash_secret)
        hashes = chain_block_hashes(prompt, self._block_size, root) if self._block_size else []
        request = RouteRequest(req_id, self._model, prompt, excluded, hashes, self._block_size, salt)
        with span("route", **{"tandem.req_id": req_id, "tandem.excluded": len(excluded)}) as current:
            try:  # NOTE: the pool fails over between replicas, and waits for a restarting one (up to the timeout)
                route = await self._routers.route(request, self._route_timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise errors.from_rpc_error(exc, "route") from None
            current.set_attribute("tandem.decode_worker", route.decode.worker_id)
            if route.prefill is not None:
                current.set_attribute("tandem.prefill_worker", route.prefill.worker_id)
            return route

    async def _disaggregated(
        self, route: Route, req_id: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        first = await self._prefill(route, req_id, prompt, params)
        if first is None:
            stream = self._generate(route.decode.address, req_id, prompt, params)
        else:
            stream = self._continue(route, req_id, prompt, params, first)
        async with aclosing(stream):
            async for delta in stream:
                yield delta

    async def _continue(
        self, route: Route, req_id: str, prompt: list[int], params: SamplingParams, first: Prefilled
    ) -> AsyncIterator[TokenDelta]:
        """Stream the prefill worker's first token at once, while the decode worker pulls the KV and goes on after
        it: the user's prompt and params, the first token as output already generated."""
        finish = first.finish_reason
        if finish in (FinishReason.ERROR, FinishReason.ABORT):
            raise errors.from_worker_finish(finish, "at prefill")
        logprobs = (first.logprob,) if first.logprob is not None else ()
        call = None
        if finish is None:  # NOTE: started before the first token goes out, so the KV pull overlaps it
            call = self._start_generate(
                route.decode.address, req_id, prompt, params, kv=first.kv, output_token_ids=[first.first_token_id]
            )
        is_handed_over = False
        try:
            yield TokenDelta((first.first_token_id,), logprobs, finish, first.num_cached_tokens)
            is_handed_over = call is not None
        finally:
            if not is_handed_over:
                self._stop(route.decode.address, req_id, call)
                if first.kv is not None:
                    self._spawn(self._release(route.prefill.address, req_id))
        if call is not None:
            async with aclosing(self._stream(route.decode.address, req_id, call)) as stream:
                async for delta in stream:
                    yield delta

    async def _prefill(self, route: Route, req_id: str, prompt: list[int], params: SamplingParams) -> Prefilled | None:
        address = route.prefill.address
        try:
            return await self._workers.prefill(address, req_id, prompt, params, self._request_timeout_s)
        except asyncio.CancelledError:
            self._spawn(self._abort(address, req_id))
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() in NO_FALLBACK_CODES:  # the request is wrong: another worker would refuse it too
                raise errors.from_rpc_error(exc, "prefill worker") from None
            log.warning(
                "prefill of %s on %s failed (%s); decoding with local prefill", req_id, address, exc.code().name
            )
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._spawn(self._report(route.prefill.worker_id, req_id, f"prefill: {exc.code().name}"))
            return None

    def _generate(
        self, address: str, req_id: str, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        call = self._start_generate(address, req_id, prompt, params)
        return self._stream(address, req_id, call)

    def _start_generate(
        self,
        address: str,
        req_id: str,
        prompt: list[int],
        params: SamplingParams,
        kv: object | None = None,
        output_token_ids: list[int] = (),
    ) -> TokenStream:
        return self._workers.generate(address, req_id, prompt, params, self._request_timeout_s, kv, output_token_ids)

    async def _stream(self, address: str, req_id: str, call: TokenStream) -> AsyncIterator[TokenDelta]:
        is_over = False  # finished, or failed: nothing left to abort
        read = call.read
        try:
            async for message in call.messages:  # NOTE: opaque here: the boundary reads it
                delta = read(message)
                is_over = delta.finish_reason is not None
                yield _checked(delta)  # NOTE: raises when the worker failed the request
                if is_over:
                    return
            is_over = True
            raise errors.WorkerFailedError("the decode worker ended the stream before the request finished")
        except grpc.aio.AioRpcError as exc:
            is_over = True
            if detail_of(exc) is None:  # NOTE: a worker cut off from us may still be running it; one that said
                self._spawn(self._abort(address, req_id))  # why it ended the call (a typed detail) has stopped it
            raise errors.from_rpc_error(exc, "decode worker") from None
        finally:
            if not is_over:  # the client left, or a stop string ended it: stop the worker now
                self._stop(address, req_id, call)
            await call.aclose()  # NOTE: now, not at garbage collection: ends its client span

    def _stop(self, address: str, req_id: str, call: TokenStream | None) -> None:
        """Cancel a Generate call (the worker aborts on cancellation) and send Abort to be sure."""
        if call is not None:
            call.cancel()
            self._spawn(self._abort(address, req_id))

    def _spawn(self, work: Coroutine) -> None:
        """Cleanup that must outlive a cancelled request; errors are logged, never raised."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, address: str, req_id: str) -> None:
        await self._quietly(self._workers.abort(address, req_id, CLEANUP_TIMEOUT_S), "abort", req_id)

    async def _release(self, address: str, req_id: str) -> None:
        await self._quietly(self._workers.release_kv(address, req_id, CLEANUP_TIMEOUT_S), "release kv", req_id)

    async def _report(self, worker_id: str, req_id: str, reason: str) -> None:
        """Tell the router at once, so that it stops routing there before the worker's lease runs out."""
        report = FailureReport(worker_id, req_id, reason)
        await self._quietly(self._routers.report_failure(report, self._route_timeout_s), "report", req_id)

    async def _complete(self, req_id: str) -> None:
        await self._quietly(self._routers.complete(req_id, self._route_timeout_s), "complete", req_id)

    @staticmethod
    async def _quietly(call, what: str, req_id: str) -> None:
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            log.info("%s of %s failed: %s", what, req_id, exc.code().name)


def _checked(delta: TokenDelta) -> TokenDelta:
    if delta.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
        raise errors.from_worker_finish(delta.finish_reason)
    return delta
