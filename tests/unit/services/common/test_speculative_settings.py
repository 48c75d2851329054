"""Speculative decoding's worker settings: TANDEM_WORKER_SPECULATIVE / --speculative reach the native engine, a bad
value or another engine stops the worker at start, and the engine's counters reach /metrics."""

import pytest

from engines.base import EngineStats
from services.common.engine_factory import engine_spec
from services.common.metrics import WorkerMetrics
from services.common.roles import WorkerRole
from services.common.settings import SettingsError
from services.common.worker_settings import WorkerSettings, parse_worker_settings
from tests.unit.observability.test_service_metrics import samples, stats


def test_the_flag_and_the_environment_reach_the_native_engine(monkeypatch):
    s = parse_worker_settings(
        WorkerRole.DECODE, ["--model", "m", "--speculative", "ngram", "--num-speculative-tokens", "6"]
    )
    opts = engine_spec(s).config.speculation
    assert (opts.speculative, opts.num_speculative_tokens) == ("ngram", 6)
    monkeypatch.setenv("TANDEM_WORKER_SPECULATIVE", "ngram")
    assert parse_worker_settings(WorkerRole.DECODE, ["--model", "m"]).speculation.speculative == "ngram"
    assert engine_spec(WorkerSettings(role="decode", model="m")).config.speculation.speculative == ""
    s = parse_worker_settings(WorkerRole.DECODE, ["--model", "m", "--speculative", "draft:/models/small"])
    assert (s.speculation.method, s.speculation.draft_dir) == ("draft", "/models/small")


def refused(*flags: str) -> None:
    parse_worker_settings(WorkerRole.DECODE, ["--model", "m", *flags])


def test_bad_values_are_refused_at_start():
    with pytest.raises(SettingsError, match="speculative method must be one of"):
        refused("--speculative", "medusa")
    with pytest.raises(SettingsError, match="needs its model directory"):
        refused("--speculative", "draft")
    with pytest.raises(SettingsError, match="max_draft_tokens must be >= 1"):
        refused("--speculative", "ngram", "--num-speculative-tokens", "0")
    with pytest.raises(SettingsError, match="runs in the native engine"):
        refused("--engine", "sim", "--speculative", "ngram")


def test_the_counters_reach_the_metrics():
    m = WorkerMetrics(
        lambda: stats(num_spec_proposed=40, num_spec_accepted=30, num_spec_verify_steps=12),
        lambda: "decode-0",
        "decode",
    )
    got = samples(m.registry)
    labels = (("role", "decode"), ("worker_id", "decode-0"))
    assert got[("tandem_worker_spec_proposed_tokens_total", labels)] == 40
    assert got[("tandem_worker_spec_accepted_tokens_total", labels)] == 30
    assert got[("tandem_worker_spec_verify_steps_total", labels)] == 12
    assert isinstance(stats(), EngineStats)
