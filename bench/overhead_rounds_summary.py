"""Sums up one or more `tandem bench overhead --security-rounds N --json` files: tokens/s per round, secure against
baseline, the ratio of the medians and per-round ratios, and each process's CPU µs per streamed token with the
secure-minus-baseline difference of each round. Reads JSON only; measures nothing.

    python bench/overhead_rounds_summary.py bench/results/overhead-security-rounds-fourth*.json
"""

import json
import statistics
import sys

SERVICES = ("decode-0", "gateway", "prefill-0", "router")


def pairs(paths: list[str]) -> list[tuple[dict, dict]]:
    """(secure, baseline) phase of each round, rounds of every file in order."""
    found = []
    for path in paths:
        phases = [p for p in json.load(open(path))["phases"] if p["security_round"] >= 0]
        for r in sorted({p["security_round"] for p in phases}):
            side = {p["is_plaintext"]: p for p in phases if p["security_round"] == r}
            found.append((side[False], side[True]))
    return found


def per_token(phase: dict) -> dict[str, float]:
    tokens = max(1, phase["summary"]["num_output_tokens"])
    cpu = {name: 1e6 * phase["cpu_s"].get(name, 0.0) / tokens for name in SERVICES}
    return {**cpu, "stack": sum(cpu.values())}


def main(paths: list[str]) -> None:
    rounds = pairs(paths)
    tps = [(s["summary"]["output_tokens_per_s"], b["summary"]["output_tokens_per_s"]) for s, b in rounds]
    print("| round | tokens/s, secure / baseline (ratio) | stack CPU µs/token, secure / baseline | errors |")
    print("|---|---|---|---|")
    for i, ((s, b), (ts, tb)) in enumerate(zip(rounds, tps)):
        errors = s["summary"]["num_errors"] + b["summary"]["num_errors"]
        print(
            f"| {i} | {ts:,.0f} / {tb:,.0f} ({ts / tb:.3f}x) | {per_token(s)['stack']:.1f} / "
            f"{per_token(b)['stack']:.1f} | {errors} |"
        )
    ms, mb = statistics.median(t[0] for t in tps), statistics.median(t[1] for t in tps)
    ratios = [ts / tb for ts, tb in tps]
    print(
        f"\nratio of medians {ms:,.0f} / {mb:,.0f} = {ms / mb:.3f}x; per round median {statistics.median(ratios):.3f}"
        f", spread {min(ratios):.3f}-{max(ratios):.3f}\n"
    )
    print("| process | secure / baseline µs/token (medians) | difference, median | per round |")
    print("|---|---|---|---|")
    for name in (*SERVICES, "stack"):
        sec, base = [per_token(s)[name] for s, _ in rounds], [per_token(b)[name] for _, b in rounds]
        diffs = [a - b for a, b in zip(sec, base)]
        print(
            f"| {name} | {statistics.median(sec):.1f} / {statistics.median(base):.1f} | "
            f"{statistics.median(diffs):+.1f} | {', '.join(f'{d:+.1f}' for d in diffs)} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
