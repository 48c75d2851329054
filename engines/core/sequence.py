"""Sequence: one request's tokens, progress and blocks as the scheduler sees them, and the one place that
decides when a request stops. No torch, no I/O."""

from dataclasses import dataclass, field
from enum import Enum

from engines.base.types import FinishReason, SamplingParams, TokenLogprob
from engines.core.speculative import SpecState


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    HELD = "held"  # prefilled, KV kept for export
    LOADING = "loading"  # holds device blocks whose KV a load is filling: never scheduled, never preempted
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    req_id: str
    token_ids: list[int]  # prompt + generated so far (including output tokens generated elsewhere)
    num_prompt_tokens: int
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    max_model_len: int = 1 << 30
    hold_kv: bool = False
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache or an import
    was_admitted: bool = False
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of full blocks, extended lazily
    hash_root: int = 0  # the first block's parent in the hash chain (block_hash.chain_root: the tenant's salt)
    num_registered_blocks: int = 0  # leading blocks of block_table already in the prefix cache
    finish_reason: FinishReason | None = None
    num_emitted_tokens: int = 0  # generated tokens already sent out (or given with the request)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    held_until: float = 0.0
    arrival_s: float = 0.0  # time.monotonic() when added
    first_scheduled_s: float = 0.0  # when a step first computed it; 0: not yet
    may_onboard: bool = True  # its prefix may still be looked up in the lower KV tiers
    spec: SpecState = field(default_factory=SpecState)  # its speculative decoding record (this engine's only)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.params.stop_token_ids + (() if self.params.ignore_eos else self.eos_token_ids)

    def banned_token_ids(self) -> tuple[int, ...]:
        """Tokens the next sample must not be: every stop token while fewer than min_tokens are out."""
        return self.stop_token_ids if self.num_output_tokens < self.params.min_tokens else ()

    def append_token(self, token_id: int) -> None:
        """Add a sampled token and decide whether the sequence is done."""
        self.token_ids.append(token_id)
        num_out = self.num_output_tokens
        if num_out > self.params.min_tokens - 1 and token_id in self.stop_token_ids:
            self.finish_reason = FinishReason.STOP
        elif num_out >= self.params.max_tokens or self.num_tokens >= self.max_model_len:
            self.finish_reason = FinishReason.LENGTH
        elif self.hold_kv:  # NOTE: prefill only: one token, then the KV waits for a decode worker
            self.finish_reason = FinishReason.PREFILLED

    def reset_for_recompute(self) -> None:
        """Preempted: drop all KV; the tokens stay and are prefilled again."""
        self.num_computed_tokens = 0
        self.num_registered_blocks = 0
        self.block_table = []
        self.status = SequenceStatus.WAITING
        self.may_onboard = True  # NOTE: its blocks were just freed: the host tier may still hold them

    def take_new_tokens(self) -> tuple[tuple[int, ...], tuple[TokenLogprob, ...]]:
        """Generated tokens (and logprobs) not yet sent out; marks them sent."""
        start = self.num_prompt_tokens + self.num_emitted_tokens
        new = tuple(self.token_ids[start:])
        self.num_emitted_tokens += len(new)
        logprobs, self.pending_logprobs = tuple(self.pending_logprobs), []
        return new, logprobs
