"""Router replicas against one router in the simulator: the prefix hit rate within 2% (relative) of one router's,
and no herding (the busiest worker's share of routes within 1.2x of one router's). Verdicts only: the runs are
cli.py's, the replicas routers.py's.
"""

MAX_HIT_RATE_LOSS = 0.02  # relative to one router's hit rate
MAX_BUSIEST_RATIO = 1.2


def run_key(policy: str, num_routers: int, counts: list[int]) -> str:
    """A run's name in the report: the policy alone when one router count is simulated."""
    return policy if len(counts) == 1 else f"{policy}@{num_routers}r"


def replica_verdicts(policies: dict[str, dict], names: list[str], counts: list[int]) -> dict[str, dict]:
    """Per policy and replica count (beside the smallest count, the reference): hit rate and busiest share."""
    out = {}
    for name in names:
        ref = policies[run_key(name, counts[0], counts)]
        for n in counts[1:]:
            run = policies[run_key(name, n, counts)]
            hit, ref_hit = run["prefix_hit_rate"], ref["prefix_hit_rate"]
            busiest, ref_busiest = _busiest_share(run), _busiest_share(ref)
            loss = (ref_hit - hit) / ref_hit if ref_hit > 0 else 0.0
            ratio = busiest / ref_busiest if ref_busiest > 0 else 0.0
            out[run_key(name, n, counts)] = {
                "prefix_hit_rate": hit,
                "reference_hit_rate": ref_hit,
                "hit_rate_loss": loss,
                "busiest_share": busiest,
                "reference_busiest_share": ref_busiest,
                "busiest_ratio": ratio,
                "meets_target": loss <= MAX_HIT_RATE_LOSS and ratio <= MAX_BUSIEST_RATIO,
            }
    return out


def format_verdicts(verdicts: dict[str, dict]) -> str:
    lines = [f"{'replicas':<16}{'hit rate':>10}{'vs 1':>10}{'loss':>8}{'busiest':>10}{'vs 1':>10}{'ratio':>8}  verdict"]
    for key, v in verdicts.items():
        lines.append(
            f"{key:<16}{v['prefix_hit_rate']:>10.4f}{v['reference_hit_rate']:>10.4f}"
            f"{v['hit_rate_loss']:>8.1%}{v['busiest_share']:>10.4f}{v['reference_busiest_share']:>10.4f}"
            f"{v['busiest_ratio']:>8.3f}  {'met' if v['meets_target'] else 'MISSED'}"
        )
    return "\n".join(lines)


def _busiest_share(run: dict) -> float:
    counts = [w["num_requests"] for w in run["load_per_worker"].values()]
    total = sum(counts)
    return max(counts) / total if total else 0.0
