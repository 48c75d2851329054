"""Decode worker servicer: Generate — pull the KV named by the handle (falling back to a local
prefill if the pull fails), join the continuous batch, stream token deltas."""
import logging

import grpc

from engines.base import EngineRequest, FinishReason
from services.common.convert import finish_to_pb, logprob_to_pb, params_from_pb
from services.common.errors import abort_with
from services.common.protos import worker_pb2
from services.common.streams import coalesced
from services.common.worker_base import WorkerService, main_for
from services.decode.kv_import import KvPuller

log = logging.getLogger(__name__)


class DecodeService(WorkerService):
    role = "decode"

    def __init__(self, settings, engine):
        super().__init__(settings, engine)
        self.puller = KvPuller()

    async def Generate(self, request, context):
        kv = await self._maybe_pull(request) if request.HasField("kv") else None
        req = EngineRequest(request.req_id, tuple(request.token_ids), params_from_pb(request.params), kv=kv)
        try:
            stream = self.engine.add_request(req)
        except Exception as exc:
            await abort_with(context, exc)
        first = True
        # NOTE: a cancelled call closes these streams, which aborts the request in the engine
        async for out in coalesced(stream):
            if out.finish_reason is FinishReason.ERROR:
                await context.abort(grpc.StatusCode.INTERNAL, out.error or "generation failed")
            yield worker_pb2.GenerateResponse(
                token_ids=out.new_token_ids, logprobs=[logprob_to_pb(lp) for lp in out.logprobs],
                finish_reason=finish_to_pb(out.finish_reason),
                num_prompt_tokens=request.num_prompt_tokens or out.num_prompt_tokens,
                num_cached_tokens=out.num_cached_tokens, kv_imported=first and kv is not None,
            )
            first = False

    async def _maybe_pull(self, request):
        try:
            kv = await self.puller.pull(request.kv)
        except (grpc.aio.AioRpcError, ValueError) as exc:
            log.warning("KV pull for %s failed (%s); prefilling locally", request.req_id, exc)
            return None
        self.kv_bytes_imported += len(kv.data)
        if kv.token_ids != tuple(request.token_ids[: kv.num_tokens]):
            log.warning("KV for %s covers other tokens; prefilling locally", request.req_id)
            return None
        return kv


def main(argv: list[str] | None = None) -> None:
    main_for("decode", DecodeService, argv)
