"""TensorRT-LLM's streamed results -> tandem's RequestOutput deltas, for one request. TensorRT-LLM streams
cumulative token lists; this keeps a cursor and emits what is new, maps finish reasons and log-probabilities,
drops the first tokens a generation-only request repeats, and turns a context-only request's end into
FinishReason.PREFILLED with its disaggregated params as kv_handle. Pure: reads attributes, imports nothing."""

from typing import Any

from engines.base.types import FinishReason, RequestOutput, TokenLogprob
from engines.trtllm.mapping import RequestPlan, encode_kv_params

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "cancelled": FinishReason.ABORT}


class OutputStream:
    def __init__(
        self,
        req_id: str,
        plan: RequestPlan,
        num_prompt_tokens: int,
        block_size: int,
        top_logprobs: int = 0,
        want_logprobs: bool = False,
    ):
        self.req_id, self.plan, self.block_size = req_id, plan, block_size
        self.num_prompt_tokens = num_prompt_tokens  # the user's prompt, whatever TensorRT-LLM was given
        self.top_logprobs, self.want_logprobs = top_logprobs, want_logprobs or top_logprobs > 0
        self.cursor = 0  # tokens of TensorRT-LLM's cumulative list already handled
        self.num_cached_tokens = num_prompt_tokens if plan.imported else 0
        self.queue_s: float | None = None
        self.finished = False

    def feed(self, result: Any) -> RequestOutput | None:
        """The delta for one streamed result; None when it adds nothing."""
        out = result.outputs[0]
        self._read_metrics(out)
        tokens = list(out.token_ids)
        start, self.cursor = self.cursor, len(tokens)
        cut, error = self._repeated(start, tokens[start:])
        new = tokens[start + cut :]
        finish = self._finish(out, result.finished) if error is None else FinishReason.ERROR
        if finish is FinishReason.ERROR and error is None:
            error = f"TensorRT-LLM ended the request with finish reason {out.finish_reason!r}"
        kv_params = b""
        if finish is FinishReason.PREFILLED:
            params = getattr(out, "disaggregated_params", None) or getattr(result, "disaggregated_params", None)
            if params is None:
                finish, error = FinishReason.ERROR, "TensorRT-LLM returned no disaggregated params for a prefill"
            else:
                kv_params = encode_kv_params(params)
        if not new and finish is None:
            return None
        lps: tuple[TokenLogprob, ...] = ()
        if self.want_logprobs and finish is not FinishReason.ERROR:
            try:
                lps = self._logprobs(tokens, list(out.logprobs or []), start + cut)
            except KeyError:
                finish, error = FinishReason.ERROR, "TensorRT-LLM returned no logprob for a sampled token"
        self.finished = finish is not None
        return RequestOutput(
            self.req_id,
            tuple(new),
            lps,
            finish,
            self.num_prompt_tokens,
            self.num_cached_tokens,
            error=error,
            queue_s=self.queue_s,
            kv_handle=kv_params,
        )

    def _repeated(self, start: int, new: list[int]) -> tuple[int, str | None]:
        """How many of `new` a generation-only request repeats from the prefill worker (already sent), and an
        error when they are not those tokens."""
        skip = self.plan.skip_tokens
        cut = max(0, min(len(skip) - start, len(new)))
        if tuple(new[:cut]) != skip[start : start + cut]:
            return cut, f"TensorRT-LLM's output began {new[:cut]}, not the prefill's {list(skip[start : start + cut])}"
        return cut, None

    def _logprobs(self, tokens: list[int], logprobs: list, first: int) -> tuple[TokenLogprob, ...]:
        """Log-probabilities of tokens[first:]. They align with the end of the token list: a generation-only
        request may leave out the entries of the tokens the prefill worker sampled."""
        offset = len(tokens) - len(logprobs)
        if first - offset < 0:
            raise KeyError(first)
        return tuple(
            _token_logprob(t, logprobs[i - offset], self.top_logprobs)
            for i, t in enumerate(tokens[first:], start=first)
        )

    def _finish(self, out: Any, finished: bool) -> FinishReason | None:
        reason = out.finish_reason
        if self.plan.holds_kv and finished and reason in (None, "length"):
            return FinishReason.PREFILLED
        if reason is None:
            return FinishReason.ERROR if finished else None
        return _FINISH.get(reason, FinishReason.ERROR)  # "timeout" and anything newer: an error

    def _read_metrics(self, out: Any) -> None:
        metrics = getattr(out, "request_perf_metrics", None)
        if metrics is None:
            return
        reused = getattr(getattr(metrics, "kv_cache_metrics", None), "num_reused_blocks", None)
        if reused is not None and not self.plan.imported:
            self.num_cached_tokens = min(self.num_prompt_tokens, reused * self.block_size)
        timing = getattr(metrics, "timing_metrics", None)
        arrival, scheduled = getattr(timing, "arrival_time", None), getattr(timing, "first_scheduled_time", None)
        if arrival is not None and scheduled is not None and scheduled >= arrival:
            self.queue_s = (scheduled - arrival).total_seconds()


def _token_logprob(token: int, entry: Any, top_n: int) -> TokenLogprob:
    """`entry`: {token_id: Logprob(logprob, rank)} (the sampled token among them), or a bare float."""
    if isinstance(entry, float):
        return TokenLogprob(token, entry)
    ranked = sorted(entry.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30, -kv[1].logprob))
    return TokenLogprob(token, entry[token].logprob, tuple((t, lp.logprob) for t, lp in ranked[:top_n]))
