"""TimingProfile: what a simulated engine costs (prefill and decode step time, KV capacity, KV transfer),
loaded from a JSON data file or fitted from `tandem bench engine --json` measurements. Pure: no torch."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if min(self.block_size, self.num_blocks, self.max_num_seqs, self.max_num_batched_tokens) < 1:
            raise ProfileError(f"profile {self.name!r}: block and sequence limits must be >= 1")
        if len(self.prefill_ms_coeffs) != 3 or len(self.decode_ms_coeffs) != 3:
            raise ProfileError(f"profile {self.name!r}: prefill and decode take three coefficients each")
        if self.kv_transfer_gb_per_s <= 0 or self.min_step_ms < 0:
            raise ProfileError(f"profile {self.name!r}: need kv_transfer_gb_per_s > 0 and min_step_ms >= 0")

    def prefill_s(self, num_tokens: int) -> float:
        """Time to prefill `num_tokens` uncached tokens in one step (0 for none)."""
        if num_tokens <= 0:
            return 0.0
        a, b, c = self.prefill_ms_coeffs
        return max((a * num_tokens + b) * num_tokens + c, self.min_step_ms) / 1e3

    def decode_s(self, active_fraction: float) -> float:
        """Time of one decode step with `active_fraction` of the KV blocks in use."""
        a, b, c = self.decode_ms_coeffs
        return max((a * active_fraction + b) * active_fraction + c, self.min_step_ms) / 1e3

    def step_s(self, num_prefill_tokens: int, num_decodes: int, active_fraction: float) -> float:
        """A mixed step costs its prefill plus, when any sequence decodes, one decode step."""
        decode = self.decode_s(active_fraction) if num_decodes else 0.0
        return self.prefill_s(num_prefill_tokens) + decode

    def transfer_s(self, num_tokens: int) -> float:
        """Moving `num_tokens` tokens of KV from a prefill worker to a decode worker."""
        return num_tokens * self.kv_bytes_per_token / (self.kv_transfer_gb_per_s * 1e9)

    def to_dict(self) -> dict:
        return {f: (list(v) if isinstance(v, tuple) else v) for f in self.__dataclass_fields__
                for v in [getattr(self, f)]}

    @classmethod
    def from_dict(cls, data: dict) -> "TimingProfile":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        try:
            for key in ("prefill_ms_coeffs", "decode_ms_coeffs", "sources"):
                if key in known:
                    known[key] = tuple(known[key])
            return cls(**known)
        except TypeError as exc:
            raise ProfileError(f"not a timing profile: {exc}") from None


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> TimingProfile:
    """A shipped profile by name (engines/sim/profiles/NAME.json) or any profile file by path."""
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
        blocks = n * -(-(isl + osl // 2) // base.block_size)
        prefill.append((n * isl, native["ttft_s_p50"] * 1e3))
        decode.append((min(blocks / base.num_blocks, 1.0), native["itl_s_p50"] * 1e3))
    if not prefill:
        raise ProfileError(f"{json_path}: no native engine results to fit")
    name = f"bench-{report.get('model', 'unknown')}".replace("/", "_")
    sources = (f"fitted from {json_path} ({len(prefill)} workload(s)) by engines/sim/profile.py",)
    return TimingProfile.from_dict({**base.to_dict(), "name": name, "sources": sources,
                                    "prefill_ms_coeffs": _fit(prefill), "decode_ms_coeffs": _fit(decode)})


def _fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares a*x^2 + b*x + c through the points, of degree < the number of distinct x."""
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    degree = min(2, len(set(xs.tolist())) - 1)
    coeffs = np.polyfit(xs, ys, degree) if degree > 0 else np.array([ys.mean()])
    return tuple(float(c) for c in np.concatenate([np.zeros(3 - len(coeffs)), coeffs]))
