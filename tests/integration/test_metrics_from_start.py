"""Every metric a dashboard reads exists in some service's /metrics before the first request (labelled counters
and histograms start at zero), on a stack whose gateway runs as two processes (and a planner held at one worker per
role, and a host KV tier); then one request is counted once in the gateway's merged metrics."""

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import running_stack
from tests.integration.test_observability import _dashboard_exprs


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from tandem.models.init import init_model

    model = init_model(tmp_path_factory.mktemp("zero-model") / "tiny", "llama", tiny=True, config_only=True)
    with running_stack(
        model,
        tmp_path_factory.mktemp("from-start"),
        engine="zero",
        num_prefill=1,
        num_decode=1,
        num_gateway_workers=2,
        planner=True,
        env={"TANDEM_PLANNER_MAX_PREFILL": "1", "TANDEM_PLANNER_MAX_DECODE": "1"},
        # NOTE: the KV tier panels read series a worker exports only when it has a tier
        worker_args=("--num-blocks", "512", "--max-num-batched-tokens", "1024", "--kv-host-gb", "0.01"),
    ) as s:
        yield s


def scrape(stack) -> dict[str, dict[tuple, float]]:
    """service name -> {(sample name, labels): value}"""
    out = {}
    for name, url in stack.metrics_urls.items():
        text = httpx.get(url, timeout=10).text
        out[name] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
    return out


def test_dashboard_metrics_exist_before_any_request_and_count_once_after(stack):
    names = {m for _, _, expr in _dashboard_exprs() for m in re.findall(r"tandem_[a-z_]+", expr)}
    assert len(names) >= 20
    before = scrape(stack)
    present = {sample for samples in before.values() for sample, _ in samples}
    missing = sorted(n for n in names if n not in present)
    assert not missing, f"no series before the first request: {missing}"
    gateway = before["gateway"]
    served = stack.cfg.model.split("/")[-1]
    assert gateway[("tandem_gateway_goodput_requests_total", (("model", served),))] == 0

    reply = httpx.post(
        f"{stack.url}/v1/completions", json={"model": served, "prompt": [1, 2, 3], "max_tokens": 4}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    after = scrape(stack)["gateway"]
    key = (("model", served), ("route", "/v1/completions"), ("status", "200"))
    assert after[("tandem_gateway_requests_total", key)] == 1  # merged over both processes, counted once
    assert after[("tandem_gateway_completion_tokens_total", (("model", served),))] == 4
