"""The panel lists of the Overview (what clients see, from the gateway) and Workers dashboards."""

from dashboard_panels import RATE, Panel, Row, Target, quantiles

# --- Overview: what clients see, from the gateway -------------------------------------------------------------

GW = 'model=~"$model"'
OVERVIEW = (
    Row(
        "Traffic",
        (
            Panel(
                "Requests by status",
                (Target(f"sum by (status) (rate(tandem_gateway_requests_total{{{GW}}}[{RATE}]))", "{{status}}"),),
                unit="reqps",
                width=8,
                description="Finished HTTP requests per second by final status (499: the client left).",
            ),
            Panel(
                "Error rate by status",
                (
                    Target(
                        f'sum by (status) (rate(tandem_gateway_requests_total{{{GW}, status!~"2.."}}[{RATE}]))'
                        f" / ignoring(status) group_left sum(rate(tandem_gateway_requests_total{{{GW}}}[{RATE}]))",
                        "{{status}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Share of all requests that ended with this non-2xx status (4xx: the client's, 5xx: ours).",
            ),
            Panel(
                "Requests in flight",
                (Target(f"sum by (model) (tandem_gateway_requests_in_flight{{{GW}}})", "{{model}}"),),
                width=8,
                description="Requests the gateway is serving now (admission refuses more than TANDEM_GATEWAY_MAX_INFLIGHT).",
            ),
        ),
    ),
    Row(
        "Latency",
        (
            Panel(
                "Time to first token",
                (
                    *quantiles("tandem_gateway_time_to_first_token_seconds", GW),
                    Target('max(tandem_gateway_slo_seconds{slo="ttft"})', "SLO"),
                ),
                unit="s",
                width=8,
                description="Request arrival to the first generated token.",
            ),
            Panel(
                "Inter-token latency",
                (
                    *quantiles("tandem_gateway_inter_token_latency_seconds", GW),
                    Target('max(tandem_gateway_slo_seconds{slo="itl"})', "SLO"),
                ),
                unit="s",
                width=8,
                description="Time between consecutive tokens of one choice.",
            ),
            Panel(
                "End-to-end latency",
                quantiles("tandem_gateway_request_duration_seconds", GW),
                unit="s",
                width=8,
                description="Request arrival to its last byte.",
            ),
        ),
    ),
    Row(
        "Goodput and tokens",
        (
            Panel(
                "Goodput",
                (
                    Target(f"sum(rate(tandem_gateway_goodput_requests_total{{{GW}}}[{RATE}]))", "met both SLOs"),
                    Target(f'sum(rate(tandem_gateway_requests_total{{{GW}, status=~"2.."}}[{RATE}]))', "successful"),
                ),
                unit="reqps",
                width=8,
                description="Successful requests per second, and those that met both the TTFT and the ITL SLO.",
            ),
            Panel(
                "Goodput share",
                (
                    Target(
                        f"sum(rate(tandem_gateway_goodput_requests_total{{{GW}}}[{RATE}]))"
                        f' / sum(rate(tandem_gateway_requests_total{{{GW}, status=~"2.."}}[{RATE}]))',
                        "met both SLOs",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Of the successful requests, the share that met both SLOs.",
            ),
            Panel(
                "Tokens per second",
                (
                    Target(f"sum(rate(tandem_gateway_prompt_tokens_total{{{GW}}}[{RATE}]))", "prompt"),
                    Target(f"sum(rate(tandem_gateway_completion_tokens_total{{{GW}}}[{RATE}]))", "generated"),
                ),
                unit="short",
                width=8,
                description="Prompt tokens of served requests and generated tokens, per second.",
            ),
        ),
    ),
)

# --- Workers: queues, KV cache, throughput and transfers of every prefill and decode worker -----------------

WK = 'worker_id=~"$worker", role=~"$role"'


def per_worker(metric: str, suffix: str = "") -> Target:
    return Target(f"sum by (worker_id) ({metric}{{{WK}}})", "{{worker_id}}" + suffix)


def per_worker_rate(metric: str, by: str = "worker_id") -> Target:
    legend = " ".join("{{" + b.strip() + "}}" for b in by.split(","))
    return Target(f"sum by ({by}) (rate({metric}{{{WK}}}[{RATE}]))", legend)


def per_worker_tier(metric: str, suffix: str = "") -> Target:
    """A per-tier gauge of every worker."""
    return Target(f"sum by (worker_id, tier) ({metric}{{{WK}}})", "{{worker_id}} {{tier}}" + suffix)


WORKERS = (
    Row(
        "Queues",
        (
            Panel(
                "Waiting requests",
                (per_worker("tandem_worker_requests_waiting"),),
                width=8,
                description="Requests queued in the engine, not yet scheduled.",
            ),
            Panel(
                "Running requests (batch size)",
                (per_worker("tandem_worker_requests_running"),),
                width=8,
                description="Requests in the running batch.",
            ),
            Panel(
                "Prefills held for KV pull",
                (per_worker("tandem_worker_requests_held"),),
                width=8,
                description="Prefill workers: finished prefills whose KV cache waits for a decode worker to pull it.",
            ),
        ),
    ),
    Row(
        "KV cache",
        (
            Panel(
                "KV blocks used / total",
                (
                    per_worker("tandem_worker_kv_blocks_used", " used"),
                    per_worker("tandem_worker_kv_blocks_total", " total"),
                ),
                width=8,
            ),
            Panel(
                "KV cache usage",
                (
                    Target(
                        f"sum by (worker_id) (tandem_worker_kv_blocks_used{{{WK}}})"
                        f" / sum by (worker_id) (tandem_worker_kv_blocks_total{{{WK}}})",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
            ),
            Panel(
                "Prefix cache hit rate",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_prefix_cache_hits_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_prefix_cache_queries_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Prompt tokens served from the prefix cache / prompt tokens looked up.",
            ),
            Panel(
                "Free blocks holding a reusable prefix", (per_worker("tandem_worker_kv_blocks_cached_free"),), width=12
            ),
            Panel(
                "Preemptions per second",
                (per_worker_rate("tandem_worker_preemptions_total"),),
                width=12,
                description="Sequences preempted (recomputed later) because KV blocks ran out.",
            ),
        ),
    ),
    Row(
        "KV tiers",
        (
            Panel(
                "Tier blocks used / total",
                (
                    per_worker_tier("tandem_worker_kv_tier_blocks_used", " used"),
                    per_worker_tier("tandem_worker_kv_tier_blocks_total", " total"),
                ),
                width=8,
                description="Host and disk KV tiers (workers run with --kv-host-gb / --kv-disk-gb).",
            ),
            Panel(
                "Tier hit rate",
                (
                    Target(
                        f"sum by (worker_id, tier) (rate(tandem_worker_kv_tier_prefix_hits_total{{{WK}}}[{RATE}]))"
                        f" / on (worker_id) group_left sum by (worker_id) "
                        f"(rate(tandem_worker_prefix_cache_queries_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}} {{tier}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Prompt tokens onboarded from each tier / prompt tokens looked up.",
            ),
            Panel(
                "Onboarding time per second",
                (per_worker_rate("tandem_worker_kv_onboard_seconds_total"),),
                unit="s",
                width=8,
                description="Seconds of onboarding loads per second; divided by the rate of "
                "tandem_worker_kv_onboards_total it is the mean onboard latency.",
            ),
            Panel(
                "Bytes offloaded per second",
                (per_worker_rate("tandem_worker_kv_tier_offloaded_bytes_total", "worker_id, tier"),),
                unit="Bps",
                width=8,
                description="Into the host tier (write-through) and onto disk.",
            ),
            Panel(
                "Bytes onboarded per second",
                (per_worker_rate("tandem_worker_kv_tier_onboarded_bytes_total", "worker_id, tier"),),
                unit="Bps",
                width=8,
            ),
            Panel("Disk write errors", (per_worker("tandem_worker_kv_disk_write_errors_total"),), width=8),
        ),
    ),
    Row(
        "Throughput",
        (
            Panel(
                "Prefill tokens per second",
                (per_worker_rate("tandem_worker_prompt_tokens_total"),),
                width=8,
                description="Prompt tokens computed (cache hits excluded).",
            ),
            Panel("Decode tokens per second", (per_worker_rate("tandem_worker_generated_tokens_total"),), width=8),
            Panel("RPCs by status", (per_worker_rate("tandem_worker_rpcs_total", "rpc, code"),), unit="reqps", width=8),
        ),
    ),
    Row(
        "Speculative decoding",
        (
            Panel(
                "Acceptance rate",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_spec_accepted_tokens_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_spec_proposed_tokens_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                description="Proposed tokens accepted / proposed (workers with --speculative).",
            ),
            Panel(
                "Mean accepted length",
                (
                    Target(
                        f"sum by (worker_id) (rate(tandem_worker_spec_accepted_tokens_total{{{WK}}}[{RATE}]))"
                        f" / sum by (worker_id) (rate(tandem_worker_spec_verify_steps_total{{{WK}}}[{RATE}]))",
                        "{{worker_id}}",
                    ),
                ),
                width=8,
                description="Proposed tokens accepted per verifying step (each step also adds one token).",
            ),
            Panel(
                "Proposed and accepted tokens per second",
                (
                    per_worker_rate("tandem_worker_spec_proposed_tokens_total"),
                    per_worker_rate("tandem_worker_spec_accepted_tokens_total"),
                ),
                width=8,
            ),
        ),
    ),
    Row(
        "KV transfer",
        (
            Panel(
                "KV transfer bytes per second",
                (per_worker_rate("tandem_worker_kv_transfer_bytes_total", "worker_id, direction, transport"),),
                unit="Bps",
                width=12,
                description="Export: sent by a prefill worker; import: received by a decode worker "
                "(a NIXL READ counts on the decode side only).",
            ),
            Panel(
                "KV transfer latency",
                quantiles("tandem_worker_kv_transfer_seconds", WK, by="direction, transport"),
                unit="s",
                width=12,
                description="Time of one request's KV transfer.",
            ),
        ),
    ),
)
