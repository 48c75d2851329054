"""Per-request token timing and its summary (throughput, TTFT, ITL percentiles). No torch, no I/O."""

from dataclasses import dataclass, field

import numpy as np


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linearly interpolated between order statistics; NaN when empty."""
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


@dataclass(slots=True)
class RequestTrace:
    """When one request was submitted and when each of its output tokens reached the client."""

    submit_s: float
    token_times_s: list[float] = field(default_factory=list)

    def add_arrival(self, now_s: float, num_tokens: int) -> None:
        """Record a delta of `num_tokens` tokens that arrived at `now_s`.

        A multi-token delta is spread evenly over the gap since the previous arrival, so the
        ITL reflects the rate the tokens were made at. The first delta has no previous arrival:
        its extra tokens count as arriving with the first (gap 0).
        """
        if num_tokens <= 0:
            return
        if not self.token_times_s:
            self.token_times_s.extend([now_s] * num_tokens)
            return
        prev = self.token_times_s[-1]
        step = (now_s - prev) / num_tokens
        self.token_times_s.extend(prev + step * (j + 1) for j in range(num_tokens))

    @property
    def num_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.submit_s

    @property
    def itls_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:])]


@dataclass(frozen=True, slots=True)
class RunSummary:
    num_requests: int
    num_output_tokens: int
    wall_s: float  # first submit to last token
    output_tokens_per_s: float
    ttft_s_p50: float
    ttft_s_p90: float
    itl_s_p50: float
    itl_s_p90: float
    decode_tokens_per_s: float  # per request, first to last token: 1 / mean ITL, averaged over requests


def summarize(traces: list[RequestTrace]) -> RunSummary:
    """Aggregate throughput over the whole run; TTFT over requests; ITL pooled over all token gaps."""
    if not traces or any(t.num_tokens == 0 for t in traces):
        raise ValueError("every request must have produced at least one token")
    start = min(t.submit_s for t in traces)
    end = max(t.token_times_s[-1] for t in traces)
    num_tokens = sum(t.num_tokens for t in traces)
    ttfts = [t.ttft_s for t in traces]
    itls = [gap for t in traces for gap in t.itls_s]
    return RunSummary(
        num_requests=len(traces),
        num_output_tokens=num_tokens,
        wall_s=end - start,
        output_tokens_per_s=num_tokens / (end - start) if end > start else float("nan"),
        ttft_s_p50=percentile(ttfts, 50),
        ttft_s_p90=percentile(ttfts, 90),
        itl_s_p50=percentile(itls, 50),
        itl_s_p90=percentile(itls, 90),
        decode_tokens_per_s=_mean_decode_rate(traces),
    )


def _mean_decode_rate(traces: list[RequestTrace]) -> float:
    rates = [
        (t.num_tokens - 1) / span
        for t in traces
        if t.num_tokens > 1 and (span := t.token_times_s[-1] - t.token_times_s[0]) > 0
    ]
    return sum(rates) / len(rates) if rates else float("nan")
