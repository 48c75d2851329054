"""Fake Router and Worker gRPC services with scripted token streams, on real grpc.aio servers (loopback).

They record what the gateway asked for (routes, prefills, generates, aborts, releases, completions,
cancellations) so tests can assert the exact calls.
"""

import asyncio

import grpc

from engines.base.errors import EngineError
from services.common.errors import abort_with
from services.common.protos import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc


async def start_server(add, servicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


class FakeRouter(router_pb2_grpc.RouterServicer):
    def __init__(self):
        self.decode_address = ""
        self.prefill_address: str | None = None
        self.route_error: grpc.StatusCode | None = None
        self.live_decode_workers = 1
        self.model = ""  # as the gateway routes it: set by the stack
        self.max_model_len = 512  # what the fake's workers report (the tiny test model's context)
        self.block_size = 0  # the KV block size the fake's workers report (0: no layout)
        self.routes: list[router_pb2.RouteRequest] = []
        self.completed: list[str] = []
        self.reported: list[tuple[str, str]] = []  # (worker_id, req_id) of ReportFailure calls
        self.spare_decode: list[tuple[str, str]] = []  # (worker_id, address) of decode workers after "d0"

    async def Route(self, request, context):
        self.routes.append(request)
        if self.route_error is not None:
            await context.abort(self.route_error, "no worker can take this request")
        candidates = [
            w for w in [("d0", self.decode_address), *self.spare_decode] if w[0] not in request.exclude_worker_ids
        ]
        if not candidates:  # as the real router: the request's excluded workers are never chosen
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no live decode worker (all excluded)")
        worker_id, address = candidates[0]
        response = router_pb2.RouteResponse(
            decode=router_pb2.WorkerRef(worker_id=worker_id, address=address), policy="fake"
        )
        if self.prefill_address is not None:
            response.prefill.CopyFrom(router_pb2.WorkerRef(worker_id="p0", address=self.prefill_address))
        return response

    async def Complete(self, request, context):
        self.completed.append(request.req_id)
        return router_pb2.CompleteResponse()

    async def ReportFailure(self, request, context):
        self.reported.append((request.worker_id, request.req_id))
        return router_pb2.ReportFailureResponse(quarantine_s=5.0)

    async def ListWorkers(self, request, context):
        info = router_pb2.WorkerInfo(
            worker_id="d0",
            role=common_pb2.WORKER_ROLE_DECODE,
            address=self.decode_address,
            model=self.model,
            max_model_len=self.max_model_len,
        )
        if self.block_size:
            info.layout.CopyFrom(common_pb2.KvLayout(block_size=self.block_size))
        workers = [router_pb2.WorkerStatus(worker=info, lease_expires_in_s=5.0)] * self.live_decode_workers
        return router_pb2.ListWorkersResponse(workers=workers)


def add_worker(servicer, server) -> None:
    """One fake answers every worker service (a real worker serves its role's and WorkerControl)."""
    for add in (
        worker_pb2_grpc.add_PrefillWorkerServicer_to_server,
        worker_pb2_grpc.add_DecodeWorkerServicer_to_server,
        worker_pb2_grpc.add_WorkerControlServicer_to_server,
    ):
        add(servicer, server)


class FakeWorker(
    worker_pb2_grpc.PrefillWorkerServicer, worker_pb2_grpc.DecodeWorkerServicer, worker_pb2_grpc.WorkerControlServicer
):
    """Generate streams `tokens` (continuing after the prompt's already-made tokens), one per message."""

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.address = ""
        self.hang_after: int | None = None  # Generate: stall before this many messages, until cancelled
        self.prefill_hang = False
        self.prefill_error: grpc.StatusCode | None = None
        self.generate_error: tuple[int, grpc.StatusCode] | None = None  # (after n messages, status)
        self.engine_error_after: int | None = None  # answer FINISH_REASON_ERROR after this many messages
        self.generate_requests: list[worker_pb2.GenerateRequest] = []
        self.prefill_requests: list[worker_pb2.PrefillRequest] = []
        self.aborted: list[str] = []
        self.released: list[str] = []
        self.cancelled: list[str] = []
        self.sent: dict[str, int] = {}  # req_id -> messages sent
        self.token_delay_s = 0.0  # Generate: pause before each message, like a real decode step
        self.num_cached_tokens = 0  # reported on every response, as engines do

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        done = len(request.output_token_ids)  # a prefill worker made these already
        stream = self.tokens[done : request.params.max_tokens]  # NOTE: max_tokens counts them too
        try:
            for i, token_id in enumerate(stream):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                await self._maybe_stall_or_fail(i, context)
                if i == self.engine_error_after:
                    await abort_with(context, EngineError("engine blew up"))  # as the decode worker does
                is_last = i == len(stream) - 1
                yield worker_pb2.GenerateResponse(
                    token_ids=[token_id],
                    logprobs=_logprobs(token_id, done + i, request.params),
                    finish_reason=_finish(is_last, done + i + 1 == len(self.tokens)),
                    num_prompt_tokens=len(request.token_ids),
                    kv_imported=request.HasField("kv") and i == 0,
                    num_cached_tokens=self.num_cached_tokens,
                )
                self.sent[request.req_id] = i + 1
        except (asyncio.CancelledError, GeneratorExit):  # cancelled while stalled, or between messages
            self.cancelled.append(request.req_id)
            raise

    async def _maybe_stall_or_fail(self, i: int, context) -> None:
        if self.generate_error is not None and i == self.generate_error[0]:
            await context.abort(self.generate_error[1], "worker died")
        if self.hang_after is not None and i == self.hang_after:
            await asyncio.Event().wait()

    async def Prefill(self, request, context):
        self.prefill_requests.append(request)
        try:
            if self.prefill_hang:
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(request.req_id)
            raise
        if self.prefill_error is not None:
            await context.abort(self.prefill_error, "prefill failed")
        finish = _finish(True, len(self.tokens) == 1) if min(request.params.max_tokens, len(self.tokens)) == 1 else 0
        response = worker_pb2.PrefillResponse(
            first_token_id=self.tokens[0], finish_reason=finish, num_cached_tokens=self.num_cached_tokens
        )
        if request.params.logprobs:
            response.first_logprob.CopyFrom(_logprobs(self.tokens[0], 0, request.params)[0])
        if not finish:
            response.kv.CopyFrom(
                common_pb2.KvHandle(
                    worker_id="p0",
                    address=self.address,
                    req_id=request.req_id,
                    num_tokens=len(request.token_ids),
                    num_blocks=1,
                )
            )
        return response

    async def Abort(self, request, context):
        self.aborted.append(request.req_id)
        return worker_pb2.AbortResponse()

    async def ReleaseKv(self, request, context):
        self.released.append(request.req_id)
        return worker_pb2.ReleaseKvResponse()


def _finish(is_last: bool, is_eos: bool) -> int:
    if not is_last:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return common_pb2.FINISH_REASON_STOP if is_eos else common_pb2.FINISH_REASON_LENGTH


def logprob_of(i: int) -> float:
    return -0.25 * (i + 1)


def _logprobs(token_id: int, i: int, params) -> list[common_pb2.TokenLogprob]:
    if not params.logprobs:
        return []
    top = [common_pb2.TopLogprob(token_id=token_id + k, logprob=logprob_of(i) - k) for k in range(params.top_logprobs)]
    return [common_pb2.TokenLogprob(token_id=token_id, logprob=logprob_of(i), top=top)]
