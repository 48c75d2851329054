"""What a serving benchmark measured per request, and its summary: TTFT, ITL, end-to-end latency
percentiles, throughput and goodput under SLOs. Pure arithmetic on timestamps; no clocks, no I/O."""

from dataclasses import asdict, dataclass, field

from tandem.bench.stats import percentile

QUANTILES = (50, 90, 99)


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. `chunk_times_s` holds the arrival of each token-bearing chunk."""

    submit_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    end_s: float = float("nan")
    num_output_tokens: int = 0  # the server's usage count when it sends one, else the chunks seen
    num_prompt_tokens: int = 0
    error: str | None = None
    text: str = ""  # the generated text, as streamed (a multi-turn workload sends it back)

    @property
    def is_ok(self) -> bool:
        return self.error is None and bool(self.chunk_times_s)

    @property
    def ttft_s(self) -> float:
        return self.chunk_times_s[0] - self.submit_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.submit_s

    @property
    def itls_s(self) -> list[float]:
        """Gaps between consecutive chunks (a chunk may carry several tokens)."""
        times = self.chunk_times_s
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def mean_itl_s(self) -> float:
        """First to last chunk over the tokens after the first (TPOT); 0 for a one-token answer."""
        if self.num_output_tokens <= 1 or len(self.chunk_times_s) < 2:
            return 0.0
        return (self.chunk_times_s[-1] - self.chunk_times_s[0]) / (self.num_output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objectives for goodput; None leaves that bound out."""

    ttft_s: float | None = None
    itl_s: float | None = None  # on a request's mean ITL

    def is_met(self, r: RequestRecord) -> bool:
        return (
            r.is_ok
            and (self.ttft_s is None or r.ttft_s <= self.ttft_s)
            and (self.itl_s is None or r.mean_itl_s <= self.itl_s)
        )


@dataclass(frozen=True, slots=True)
class Distribution:
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> "Distribution":
        mean = sum(values) / len(values) if values else float("nan")
        return cls(mean, *(percentile(values, q) for q in QUANTILES))


@dataclass(frozen=True, slots=True)
class ServeSummary:
    num_requests: int
    num_completed: int
    num_errors: int
    duration_s: float  # first submit to last response end
    num_output_tokens: int
    requests_per_s: float  # completed requests
    output_tokens_per_s: float  # summed over all streams
    goodput_requests_per_s: float  # completed requests that met the SLOs
    num_good: int
    ttft_s: Distribution
    itl_s: Distribution  # pooled over every chunk gap of every request
    mean_itl_s: Distribution  # one value per request (TPOT)
    e2e_s: Distribution
    first_errors: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


def summarize_serve(records: list[RequestRecord], slo: Slo = Slo(), max_errors_kept: int = 5) -> ServeSummary:
    ok = [r for r in records if r.is_ok]
    errors = [r.error or "no tokens" for r in records if not r.is_ok]
    duration = _duration(records)
    num_tokens = sum(r.num_output_tokens for r in ok)
    num_good = sum(1 for r in ok if slo.is_met(r))
    return ServeSummary(
        num_requests=len(records),
        num_completed=len(ok),
        num_errors=len(errors),
        duration_s=duration,
        num_output_tokens=num_tokens,
        requests_per_s=_rate(len(ok), duration),
        output_tokens_per_s=_rate(num_tokens, duration),
        goodput_requests_per_s=_rate(num_good, duration),
        num_good=num_good,
        ttft_s=Distribution.of([r.ttft_s for r in ok]),
        itl_s=Distribution.of([gap for r in ok for gap in r.itls_s]),
        mean_itl_s=Distribution.of([r.mean_itl_s for r in ok if r.num_output_tokens > 1]),
        e2e_s=Distribution.of([r.e2e_s for r in ok]),
        first_errors=tuple(errors[:max_errors_kept]),
    )


def _duration(records: list[RequestRecord]) -> float:
    ends = [r.end_s for r in records if r.end_s == r.end_s]  # NOTE: x == x is False only for NaN
    return max(ends) - min(r.submit_s for r in records) if ends else 0.0


def _rate(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else float("nan")
