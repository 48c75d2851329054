"""Domain dataclasses <-> protobuf messages. The only module that knows both shapes."""
from engines.base.types import (EngineStats, FinishReason, KvLayout, SamplingParams, TokenLogprob)
from services.common.protos import common_pb2 as pb

_FINISH_TO_PB = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
    FinishReason.ERROR: pb.FINISH_REASON_ERROR,
}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


def finish_to_pb(reason: FinishReason | None) -> int:
    return _FINISH_TO_PB[reason]


def finish_from_pb(value: int) -> FinishReason | None:
    return _FINISH_FROM_PB[value]


def params_to_pb(p: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_tokens=p.max_tokens, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
        stop_token_ids=list(p.stop_token_ids), ignore_eos=p.ignore_eos, logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
    )
    if p.seed is not None:
        msg.seed = p.seed
    return msg


def params_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens, temperature=msg.temperature, top_k=msg.top_k,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0, seed=msg.seed if msg.HasField("seed") else None, stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos, logprobs=msg.logprobs, top_logprobs=msg.top_logprobs,
    )


def logprob_to_pb(lp: TokenLogprob) -> pb.TokenLogprob:
    top = [pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top]
    return pb.TokenLogprob(token_id=lp.token_id, logprob=lp.logprob, top=top)


def logprob_from_pb(msg: pb.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(msg.token_id, msg.logprob, tuple((t.token_id, t.logprob) for t in msg.top))


def layout_to_pb(layout: KvLayout) -> pb.KvLayout:
    return pb.KvLayout(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                       head_dim=layout.head_dim, dtype=layout.dtype, block_size=layout.block_size)


def layout_from_pb(msg: pb.KvLayout) -> KvLayout:
    return KvLayout(msg.num_layers, msg.num_kv_heads, msg.head_dim, msg.dtype, msg.block_size)


def load_to_pb(stats: EngineStats, max_num_seqs: int) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        num_waiting=stats.num_waiting, num_running=stats.num_running, num_held=stats.num_held,
        num_blocks_used=stats.num_blocks_used, num_blocks_total=stats.num_blocks_total,
        max_num_seqs=max_num_seqs, prefix_hit_rate=stats.prefix_hit_rate,
    )
