"""TimingProfile: what a simulated engine costs (prefill and decode step time, KV capacity, KV transfer),
loaded from a JSON data file, fitted from `tandem bench engine --json` results, or built from measured step
times (`tandem bench profile`). Pure: no torch."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.base.block_hash import num_blocks_for
from engines.timing.measured import Points1D, Points2D, decode_table, interp, prefill_table, read_measurements

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "h100-llama3.1-8b"


class ProfileError(ValueError):
    """A profile file that is missing or malformed, or bench data too thin to fit."""


@dataclass(frozen=True, slots=True)
class TimingProfile:
    name: str
    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_ms_coeffs: tuple[float, float, float]  # a, b, c of a*t^2 + b*t + c; t = uncached tokens in the step
    decode_ms_coeffs: tuple[float, float, float]  # a, b, c of a*u^2 + b*u + c; u = fraction of KV blocks active
    min_step_ms: float = 1.0
    kv_bytes_per_token: int = 131072
    kv_transfer_gb_per_s: float = 64.0
    kv_host_gb_per_s: float = 50.0  # onboarding from the host tier (one way over PCIe Gen5)
    kv_disk_gb_per_s: float = 7.0  # onboarding from the disk tier (one NVMe drive)
    sources: tuple[str, ...] = ()
    # measured step times; when present they replace the coefficients (engines/timing/measured.py)
    prefill_ms_points: Points1D = ()  # (prompt tokens in the step, ms)
    decode_ms_points: Points2D = ()  # (running sequences, mean context tokens, ms)
    # speculative decoding, modelled in time only (tokens stay one per step): a decode step proposing
    # spec_num_tokens tokens, each accepted with spec_acceptance_rate, costs 1 + spec_verify_cost * k plain steps and
    # yields 1 + a + ... + a^k tokens, so the decode part of a step is scaled by their ratio; 0 tokens: off
    spec_num_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    spec_verify_cost: float = 0.05

    def __post_init__(self) -> None:
        if min(self.block_size, self.num_blocks, self.max_num_seqs, self.max_num_batched_tokens) < 1:
            raise ProfileError(f"profile {self.name!r}: block and sequence limits must be >= 1")
        if len(self.prefill_ms_coeffs) != 3 or len(self.decode_ms_coeffs) != 3:
            raise ProfileError(f"profile {self.name!r}: prefill and decode take three coefficients each")
        if min(self.kv_transfer_gb_per_s, self.kv_host_gb_per_s, self.kv_disk_gb_per_s) <= 0 or self.min_step_ms < 0:
            raise ProfileError(f"profile {self.name!r}: need copy bandwidths (kv_*_gb_per_s) > 0 and min_step_ms >= 0")
        if self.spec_num_tokens < 0 or not 0 <= self.spec_acceptance_rate < 1 or self.spec_verify_cost < 0:
            raise ProfileError(
                f"profile {self.name!r}: need spec_num_tokens >= 0, 0 <= spec_acceptance_rate < 1 "
                "and spec_verify_cost >= 0"
            )

    @property
    def spec_decode_factor(self) -> float:
        """What speculation multiplies a decode step's time by: its cost over the tokens it yields (1: off)."""
        k, a = self.spec_num_tokens, self.spec_acceptance_rate
        if k == 0:
            return 1.0
        return (1.0 + self.spec_verify_cost * k) / sum(a**j for j in range(k + 1))

    def prefill_s(self, num_tokens: int) -> float:
        """Time to prefill `num_tokens` uncached tokens in one step (0 for none)."""
        if num_tokens <= 0:
            return 0.0
        if self.prefill_ms_points:
            return (
                max(interp(prefill_table(self.prefill_ms_points, self.min_step_ms), num_tokens), self.min_step_ms) / 1e3
            )
        a, b, c = self.prefill_ms_coeffs
        return max((a * num_tokens + b) * num_tokens + c, self.min_step_ms) / 1e3

    def decode_s(self, active_fraction: float) -> float:
        """Time of one decode step with `active_fraction` of the KV blocks in use."""
        a, b, c = self.decode_ms_coeffs
        return max((a * active_fraction + b) * active_fraction + c, self.min_step_ms) / 1e3

    def decode_step_s(self, num_seqs: float, num_context_tokens: float) -> float:
        """One decode step of `num_seqs` sequences holding `num_context_tokens` of KV between them."""
        if num_seqs <= 0:
            return 0.0
        if not self.decode_ms_points:
            return self.decode_s(num_context_tokens / self.kv_capacity_tokens)
        ms = decode_table(self.decode_ms_points).step_ms(num_seqs, num_context_tokens / num_seqs)
        return max(ms, self.min_step_ms) / 1e3

    def step_s(self, num_prefill_tokens: int, num_decodes: int, active_fraction: float) -> float:
        """A mixed step costs its prefill plus, when any sequence decodes, one decode step (with measured tables,
        less the weights pass the two would otherwise both pay)."""
        if not num_decodes:
            return self.prefill_s(num_prefill_tokens)
        if not self.decode_ms_points:
            return self.prefill_s(num_prefill_tokens) + self.decode_s(active_fraction) * self.spec_decode_factor
        decode = self.decode_step_s(num_decodes, active_fraction * self.kv_capacity_tokens) * self.spec_decode_factor
        if num_prefill_tokens <= 0:
            return decode
        # NOTE: measured prefill times include one pass over the weights (min_step_ms) that a step which also
        # decodes has already paid for
        return decode + max(self.prefill_s(num_prefill_tokens) - self.min_step_ms / 1e3, 0.0)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_measured_isl(self) -> float:
        """The longest prompt the prefill timing was measured at; 0 when it is a formula."""
        return self.prefill_ms_points[-1][0] if self.prefill_ms_points else 0.0

    def transfer_s(self, num_tokens: int) -> float:
        """Moving `num_tokens` tokens of KV from a prefill worker to a decode worker."""
        return num_tokens * self.kv_bytes_per_token / (self.kv_transfer_gb_per_s * 1e9)

    def to_dict(self) -> dict:
        return {f: _lists(getattr(self, f)) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict) -> "TimingProfile":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            for key in ("prefill_ms_coeffs", "decode_ms_coeffs", "sources"):
                if key in known:
                    known[key] = tuple(known[key])
            for key in ("prefill_ms_points", "decode_ms_points"):
                if key in known:
                    known[key] = tuple(sorted(tuple(float(x) for x in p) for p in known[key]))
            return cls(**known)
        except TypeError as exc:
            raise ProfileError(f"not a timing profile: {exc}") from None


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> TimingProfile:
    """A shipped profile by name (engines/timing/profiles/NAME.json) or any profile file by path."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
        raise ProfileError(f"no profile {str(name_or_path)!r}; shipped: {shipped}")
    try:
        return TimingProfile.from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON: {exc}") from None


def profile_from_bench(json_path: str | Path, base: TimingProfile | None = None) -> TimingProfile:
    """Fit prefill and decode coefficients to a `tandem bench engine --json` report, other fields from `base`.

    Each workload's native TTFT p50 is one prefill point (t = requests x ISL, all prefilled in the first step)
    and its ITL p50 one decode point (u = the blocks its sequences hold half-way through decoding over
    `base.num_blocks`). With fewer points than coefficients the fit keeps the lower-order terms only.
    """
    base = base or load_profile()
    report = json.loads(Path(json_path).read_text())
    prefill, decode = [], []
    for entry in report.get("workloads", {}).values():
        native = entry.get("engines", {}).get("native")
        if not native:
            continue
        n, isl, osl = entry["num_requests"], entry["isl"], entry["osl"]
        blocks = n * num_blocks_for(isl + osl // 2, base.block_size)
        prefill.append((n * isl, native["ttft_s_p50"] * 1e3))
        decode.append((min(blocks / base.num_blocks, 1.0), native["itl_s_p50"] * 1e3))
    if not prefill:
        raise ProfileError(f"{json_path}: no native engine results to fit")
    name = f"bench-{report.get('model', 'unknown')}".replace("/", "_")
    sources = (f"fitted from {json_path} ({len(prefill)} workload(s)) by engines/timing/profile.py",)
    return TimingProfile.from_dict(
        {
            **base.to_dict(),
            "name": name,
            "sources": sources,
            "prefill_ms_coeffs": _fit(prefill),
            "decode_ms_coeffs": _fit(decode),
        }
    )


def profile_from_measurements(json_path: str | Path, base: TimingProfile, name: str) -> TimingProfile:
    """`base`'s limits with the measured prefill and decode step times of a `tandem bench profile` file; the
    coefficients are least-squares fits to the same points (u = batch x context / KV capacity)."""
    try:
        meta, prefill, decode = read_measurements(json_path)
    except ValueError as exc:
        raise ProfileError(str(exc)) from None
    measured_with = {k: v for k, v in meta.get("engine", {}).items() if k in ("block_size", "max_num_batched_tokens")}
    base = TimingProfile.from_dict({**base.to_dict(), **measured_with})
    capacity = base.kv_capacity_tokens
    source = (
        f"measured step times from {Path(json_path).name} ({meta.get('device', 'unknown device')}, "
        f"{meta.get('model', 'unknown model')}): {len(prefill)} prefill and {len(decode)} decode points, "
        "interpolated piecewise-linearly by engines/timing/measured.py; the coefficients are least-squares fits"
    )
    limits = ", ".join(
        f"{k}={getattr(base, k)}"
        for k in (
            "block_size",
            "num_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "min_step_ms",
            "kv_bytes_per_token",
            "kv_transfer_gb_per_s",
        )
    )
    return TimingProfile.from_dict(
        {
            **base.to_dict(),
            "name": name,
            "sources": (source, f"Limits (given, not measured): {limits}"),
            "prefill_ms_points": prefill,
            "decode_ms_points": decode,
            "prefill_ms_coeffs": _fit(list(prefill)),
            "decode_ms_coeffs": _fit([(b * c / capacity, ms) for b, c, ms in decode]),
        }
    )


def _lists(value):
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


def _fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares a*x^2 + b*x + c through the points, of degree < the number of distinct x."""
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    degree = min(2, len(set(xs.tolist())) - 1)
    coeffs = np.polyfit(xs, ys, degree) if degree > 0 else np.array([ys.mean()])
    return tuple(float(c) for c in np.concatenate([np.zeros(3 - len(coeffs)), coeffs]))
