"""`tandem bench engine --speculative`'s rows and table: alternated runs of the plain and the speculating engine reduced
to medians, the median of the pairwise speedups and its spread, identical-output and acceptance. Pure: no engine."""

from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True, slots=True)
class Run:
    """One workload on one engine: its outputs, wall time and speculation counters."""

    outputs: list[list[int]]
    seconds: float
    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds


@dataclass(frozen=True, slots=True)
class SpecWorkload:
    name: str
    kind: str  # "copy" | "chat"
    num_requests: int
    concurrency: int  # 1: batch 1, one request after another
    osl: int
    temperature: float = 0.0  # > 0: sampled with a seed per request and EOS ignored, so both sides make as many tokens

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def row(w: SpecWorkload, plain: list[Run], spec: list[Run]) -> dict:
    """`plain[i]` and `spec[i]` ran back to back: the speedup is the median of their ratios, with its spread."""
    ratios = [s.tokens_per_s / p.tokens_per_s for p, s in zip(plain, spec, strict=True)]
    last = spec[-1]
    # NOTE: sampled outputs differ by construction (verification draws differently); only greedy must match
    identical = all(s.outputs == plain[0].outputs for s in spec) if w.is_greedy else None
    return {
        "workload": w.name,
        "num_requests": w.num_requests,
        "concurrency": w.concurrency,
        "osl": w.osl,
        "temperature": w.temperature,
        "output_tokens": plain[0].num_tokens,
        "plain_tok_s": median(r.tokens_per_s for r in plain),
        "spec_tok_s": median(r.tokens_per_s for r in spec),
        "speedup": median(ratios),
        "speedup_min": min(ratios),
        "speedup_max": max(ratios),
        "pairs": [[p.tokens_per_s, s.tokens_per_s] for p, s in zip(plain, spec)],
        "identical": identical,
        "proposed": last.proposed,
        "accepted": last.accepted,
        "acceptance_rate": last.accepted / last.proposed if last.proposed else 0.0,
        "mean_accepted_len": last.accepted / last.verify_steps if last.verify_steps else 0.0,
    }


def format_table(report: dict) -> str:
    head = (
        f"{'workload':<28}{'plain tok/s':>12}{'spec tok/s':>11}{'speedup':>9}{'spread':>13}{'identical':>10}"
        f"{'proposed':>9}{'accept':>7}{'mean len':>9}{'HF tok/s':>9}{'HF spec':>9}"
    )
    title = (
        f"model {report['model']}, speculative={report['speculative']}, threads={report['threads']}, "
        f"{report['repeats']} alternated pairs (medians)"
    )
    lines = [title, head, "-" * len(head)]
    for r in report["workloads"]:
        hf = r.get("transformers_tok_s")
        hf_cells = f"{hf:>9.1f}{r['transformers_spec_tok_s']:>9.1f}" if hf else f"{'-':>9}{'-':>9}"
        same = "-" if r["identical"] is None else str(r["identical"])
        spread = f"{r['speedup_min']:.2f}-{r['speedup_max']:.2f}"
        lines.append(
            f"{r['workload']:<28}{r['plain_tok_s']:>12.1f}{r['spec_tok_s']:>11.1f}{r['speedup']:>8.2f}x"
            f"{spread:>13}{same:>10}{r['proposed']:>9}{r['acceptance_rate']:>7.2f}"
            f"{r['mean_accepted_len']:>9.2f}{hf_cells}"
        )
    return "\n".join(lines)
