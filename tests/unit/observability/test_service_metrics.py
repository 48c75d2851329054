"""The workers', router's and gateway's Prometheus metrics, read back through the exposition format."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engines.base import EngineStats
from services.common.metrics import MetricsEndpoint, WorkerMetrics
from services.gateway.metrics import GatewayMetrics
from services.router.metrics import RouterMetrics
from services.router.types import RouteDecision, WorkerInfo, WorkerLoad, WorkerRole, WorkerView


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def stats(**kw) -> EngineStats:
    base = dict(
        num_waiting=3,
        num_running=5,
        num_held=1,
        num_blocks_total=100,
        num_blocks_used=40,
        num_blocks_cached_free=7,
        block_size=16,
        max_model_len=512,
        prefix_queries=1000,
        prefix_hits=250,
        num_preemptions=2,
        num_prompt_tokens_computed=750,
        num_generated_tokens=90,
    )
    return EngineStats(**{**base, **kw})


def test_worker_metrics_read_the_engine_at_scrape_time():
    current = {"stats": stats()}
    m = WorkerMetrics(lambda: current["stats"], lambda: "decode-0", "decode")
    labels = (("role", "decode"), ("worker_id", "decode-0"))
    got = samples(m.registry)
    assert got[("tandem_worker_requests_waiting", labels)] == 3
    assert got[("tandem_worker_requests_running", labels)] == 5
    assert got[("tandem_worker_kv_blocks_used", labels)] == 40
    assert got[("tandem_worker_kv_blocks_total", labels)] == 100
    assert got[("tandem_worker_prefix_cache_hits_total", labels)] == 250
    assert got[("tandem_worker_prefix_cache_queries_total", labels)] == 1000
    assert got[("tandem_worker_preemptions_total", labels)] == 2
    current["stats"] = stats(num_running=9, num_generated_tokens=120)
    got = samples(m.registry)
    assert got[("tandem_worker_requests_running", labels)] == 9
    assert got[("tandem_worker_generated_tokens_total", labels)] == 120


def test_worker_exports_the_grammar_mask_counters():
    m = WorkerMetrics(
        lambda: stats(num_grammar_masks=40, grammar_mask_seconds=0.25, grammar_wait_seconds=0.01),
        lambda: "decode-0",
        "decode",
    )
    labels = (("role", "decode"), ("worker_id", "decode-0"))
    got = samples(m.registry)
    assert got[("tandem_worker_grammar_masks_total", labels)] == 40
    assert got[("tandem_worker_grammar_mask_seconds_total", labels)] == 0.25
    assert got[("tandem_worker_grammar_wait_seconds_total", labels)] == 0.01


def test_worker_exports_the_model_server_names_the_inference_extension_reads():
    current = {"stats": stats()}
    m = WorkerMetrics(lambda: current["stats"], lambda: "decode-0", "decode", model_name="SmolLM2")
    labels = (("model_name", "SmolLM2"),)
    got = samples(m.registry)
    assert got[("vllm:num_requests_waiting", labels)] == 3
    assert got[("vllm:num_requests_running", labels)] == 5
    assert got[("vllm:kv_cache_usage_perc", labels)] == 0.4  # a fraction, as vLLM's
    current["stats"] = stats(num_blocks_used=100, num_waiting=0)
    got = samples(m.registry)
    assert got[("vllm:kv_cache_usage_perc", labels)] == 1.0 and got[("vllm:num_requests_waiting", labels)] == 0
    assert got[("tandem_worker_requests_waiting", (("role", "decode"), ("worker_id", "decode-0")))] == 0


def test_worker_rpcs_and_kv_transfers_are_counted():
    m = WorkerMetrics(stats, lambda: "prefill-0", "prefill")
    m.rpc_done("Prefill", "OK")
    m.rpc_done("Prefill", "OK")
    m.rpc_done("PullKv", "CANCELLED")
    m.kv_transfer("export", 4096, 0.02, "grpc")
    got = samples(m.registry)
    base = (("role", "prefill"), ("worker_id", "prefill-0"))
    assert got[("tandem_worker_rpcs_total", tuple(sorted(base + (("rpc", "Prefill"), ("code", "OK")))))] == 2
    assert got[("tandem_worker_rpcs_total", tuple(sorted(base + (("rpc", "PullKv"), ("code", "CANCELLED")))))] == 1
    key = tuple(sorted(base + (("direction", "export"), ("transport", "grpc"))))
    assert got[("tandem_worker_kv_transfer_bytes_total", key)] == 4096
    assert got[("tandem_worker_kv_transfer_seconds_count", key)] == 1
    assert got[("tandem_worker_kv_transfer_seconds_bucket", tuple(sorted(key + (("le", "0.025"),))))] == 1
    assert got[("tandem_worker_kv_transfer_seconds_bucket", tuple(sorted(key + (("le", "0.01"),))))] == 0


def view(worker_id: str, role: WorkerRole, **load) -> WorkerView:
    return WorkerView(WorkerInfo(worker_id, role, "127.0.0.1:1", "m"), WorkerLoad(**load), num_inflight=2)


def test_router_metrics_count_decisions_and_show_each_workers_load():
    d0 = view("decode-0", WorkerRole.DECODE, num_running=4, num_waiting=1, num_blocks_used=30, num_blocks_total=120)
    p0 = view("prefill-0", WorkerRole.PREFILL)
    m = RouterMetrics(lambda: [d0, p0])
    m.decided(RouteDecision(d0, p0, "kv", num_cached_tokens=64, reason="long"), num_tokens=256, seconds=5e-5)
    m.decided(RouteDecision(d0, None, "kv", num_cached_tokens=0, reason="short"), num_tokens=16, seconds=5e-5)
    m.failed("kv", "unavailable")
    got = samples(m.registry)
    assert got[("tandem_router_decisions_total", (("outcome", "disaggregated"), ("policy", "kv")))] == 1
    assert got[("tandem_router_decisions_total", (("outcome", "aggregated"), ("policy", "kv")))] == 1
    assert got[("tandem_router_decisions_total", (("outcome", "unavailable"), ("policy", "kv")))] == 1
    assert got[("tandem_router_predicted_cached_tokens_total", (("policy", "kv"),))] == 64
    assert got[("tandem_router_routed_tokens_total", (("policy", "kv"),))] == 272
    assert got[("tandem_router_predicted_overlap_ratio_bucket", (("le", "0.2"), ("policy", "kv")))] == 1  # 0 only
    assert got[("tandem_router_predicted_overlap_ratio_bucket", (("le", "0.3"), ("policy", "kv")))] == 2  # + 0.25
    assert got[("tandem_router_workers", (("role", "decode"),))] == 1
    assert got[("tandem_router_workers", (("role", "prefill"),))] == 1
    key = (("role", "decode"), ("worker_id", "decode-0"))
    assert got[("tandem_router_worker_requests_running", key)] == 4
    assert got[("tandem_router_worker_kv_usage_ratio", key)] == 0.25
    assert got[("tandem_router_worker_requests_in_flight", key)] == 2


def test_goodput_counts_only_successes_within_both_slos(monkeypatch):
    clock = {"t": 100.0}
    monkeypatch.setattr("services.gateway.metrics.time.perf_counter", lambda: clock["t"])
    m = GatewayMetrics(slo_ttft_s=1.0, slo_itl_s=0.05)

    def run(ttft: float, gap: float, tokens: int, status: int = 200) -> None:
        timer = m.start("/v1/chat/completions", "m")
        clock["t"] += ttft
        timer.on_tokens(0, 1)
        for _ in range(tokens - 1):
            clock["t"] += gap
            timer.on_tokens(0, 1)
        timer.finish(status)

    run(0.5, 0.01, 10)  # good
    run(1.5, 0.01, 10)  # first token too late
    run(0.5, 0.2, 10)  # too slow per token
    run(0.5, 0.01, 10, status=499)  # the client left
    run(0.9, 0.0, 1)  # one token: judged on TTFT alone
    got = samples(m.registry)
    assert got[("tandem_gateway_goodput_requests_total", (("model", "m"),))] == 2
    assert got[("tandem_gateway_slo_seconds", (("slo", "ttft"),))] == 1.0


def test_the_metrics_endpoint_serves_its_registry_and_can_be_off():
    import httpx

    registry = CollectorRegistry()
    WorkerMetrics(stats, lambda: "decode-7", "decode", registry=registry)
    endpoint = MetricsEndpoint(registry, "127.0.0.1", 0)
    try:
        body = httpx.get(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=5).text
        assert 'tandem_worker_kv_blocks_used{role="decode",worker_id="decode-7"} 40.0' in body
    finally:
        endpoint.close()
    assert MetricsEndpoint(registry, "127.0.0.1", -1).port == -1


def test_router_metrics_show_the_prefix_index_per_worker_when_there_is_one():
    from engines.base.block_hash import NONE_HASH
    from engines.base.events import KvEvent, KvEventKind
    from services.router.prefix_index import PrefixIndex

    index = PrefixIndex(100)
    index.apply("decode-0", [KvEvent(1, KvEventKind.STORED, NONE_HASH, (11, 12, 13))])
    index.apply("decode-1", [KvEvent(1, KvEventKind.STORED, NONE_HASH, (11,))])
    got = samples(RouterMetrics(lambda: [], index_blocks=index.blocks_per_worker).registry)
    assert got[("tandem_router_kv_index_blocks", (("worker_id", "decode-0"),))] == 3
    assert got[("tandem_router_kv_index_blocks", (("worker_id", "decode-1"),))] == 1
    index.remove_worker("decode-0")
    got = samples(RouterMetrics(lambda: [], index_blocks=index.blocks_per_worker).registry)
    assert ("tandem_router_kv_index_blocks", (("worker_id", "decode-0"),)) not in got
    assert not any(name == "tandem_router_kv_index_blocks" for name, _ in samples(RouterMetrics(lambda: []).registry))


def test_every_series_the_dashboards_read_exists_at_zero_from_start_up():
    gateway = GatewayMetrics()
    gateway.start_at_zero("m")
    got = samples(gateway.registry)
    for route in ("/v1/chat/completions", "/v1/completions"):
        for status in ("200", "429", "499", "500", "503"):
            assert got[("tandem_gateway_requests_total", (("model", "m"), ("route", route), ("status", status)))] == 0
        assert got[("tandem_gateway_request_duration_seconds_count", (("model", "m"), ("route", route)))] == 0
    for name in (
        "tandem_gateway_goodput_requests_total",
        "tandem_gateway_prompt_tokens_total",
        "tandem_gateway_completion_tokens_total",
        "tandem_gateway_requests_in_flight",
        "tandem_gateway_time_to_first_token_seconds_count",
        "tandem_gateway_inter_token_latency_seconds_count",
    ):
        assert got[(name, (("model", "m"),))] == 0, name

    router = RouterMetrics(lambda: [])
    router.start_at_zero("kv")
    got = samples(router.registry)
    for outcome in ("aggregated", "disaggregated", "unavailable"):
        assert got[("tandem_router_decisions_total", (("outcome", outcome), ("policy", "kv")))] == 0
    for name in (
        "tandem_router_predicted_cached_tokens_total",
        "tandem_router_routed_tokens_total",
        "tandem_router_route_seconds_count",
        "tandem_router_predicted_overlap_ratio_count",
    ):
        assert got[(name, (("policy", "kv"),))] == 0, name

    worker = WorkerMetrics(stats, lambda: "prefill-0", "prefill")
    worker.start_at_zero(("Prefill", "PullKv"), ("export",), "grpc")
    got = samples(worker.registry)
    base = (("role", "prefill"), ("worker_id", "prefill-0"))
    for rpc in ("Prefill", "PullKv"):
        assert got[("tandem_worker_rpcs_total", tuple(sorted(base + (("rpc", rpc), ("code", "OK")))))] == 0
    key = tuple(sorted(base + (("direction", "export"), ("transport", "grpc"))))
    assert got[("tandem_worker_kv_transfer_bytes_total", key)] == 0
    assert got[("tandem_worker_kv_transfer_seconds_count", key)] == 0


def test_kv_tier_series_appear_with_a_host_tier_one_per_tier():
    assert not any(
        name.startswith("tandem_worker_kv_tier")
        for name, _ in samples(WorkerMetrics(stats, lambda: "decode-0", "decode").registry)
    )  # no tiers: no series
    tiered = stats(
        num_host_blocks_total=64,
        num_host_blocks_used=10,
        num_disk_blocks_total=256,
        num_disk_blocks_used=3,
        kv_block_bytes=1000,
        prefix_hits_host=48,
        prefix_hits_disk=16,
        num_blocks_offloaded_host=12,
        num_blocks_offloaded_disk=3,
        num_blocks_onboarded_host=3,
        num_blocks_onboarded_disk=1,
        num_onboards=2,
        onboard_seconds=0.5,
        num_disk_write_errors=1,
        prefill_tokens_per_s=1234.0,
    )
    got = samples(WorkerMetrics(lambda: tiered, lambda: "decode-0", "decode").registry)
    base = (("role", "decode"), ("worker_id", "decode-0"))

    def tier(name, which):
        return got[(name, tuple(sorted(base + (("tier", which),))))]

    assert (tier("tandem_worker_kv_tier_blocks_used", "host"), tier("tandem_worker_kv_tier_blocks_total", "disk")) == (
        10,
        256,
    )
    assert tier("tandem_worker_kv_tier_offloaded_bytes_total", "host") == 12_000
    assert tier("tandem_worker_kv_tier_offloaded_bytes_total", "disk") == 3_000  # bytes written to disk
    assert tier("tandem_worker_kv_tier_onboarded_blocks_total", "disk") == 1
    assert tier("tandem_worker_kv_tier_prefix_hits_total", "host") == 48
    assert got[("tandem_worker_kv_onboard_seconds_total", base)] == 0.5
    assert got[("tandem_worker_kv_onboards_total", base)] == 2
    assert got[("tandem_worker_kv_disk_write_errors_total", base)] == 1
    assert got[("tandem_worker_kv_prefill_tokens_per_second", base)] == 1234.0
