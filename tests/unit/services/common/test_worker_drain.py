"""A stopping worker drains: it waits until its engine holds no waiting, running or held (KV not yet pulled)
request, bounded by the drain time."""

import pytest

from engines.base.types import EngineStats
from services.common.worker_base import wait_idle


class Engine:
    def __init__(self, loads: list[tuple[int, int, int]]):
        self.loads = loads  # (waiting, running, held) per stats() call; the last one repeats
        self.calls = 0

    def stats(self) -> EngineStats:
        waiting, running, held = self.loads[min(self.calls, len(self.loads) - 1)]
        self.calls += 1
        return EngineStats(
            waiting,
            running,
            held,
            num_blocks_total=64,
            num_blocks_used=8,
            num_blocks_cached_free=0,
            block_size=16,
            max_model_len=512,
            prefix_queries=0,
            prefix_hits=0,
            num_preemptions=0,
            num_prompt_tokens_computed=0,
            num_generated_tokens=0,
        )


async def test_it_waits_for_running_requests_and_held_kv():
    engine = Engine([(1, 2, 0), (0, 1, 1), (0, 0, 1), (0, 0, 0)])
    assert await wait_idle(engine, timeout_s=5.0, poll_s=0.001) is True
    assert engine.calls == 4  # a prefill worker's held KV counts until it is pulled


async def test_it_gives_up_after_the_drain_time(caplog):
    engine = Engine([(0, 1, 0)])
    assert await wait_idle(engine, timeout_s=0.05, poll_s=0.01) is False
    assert "still held after" in caplog.text


def test_the_drain_time_is_a_setting_and_the_served_worker_gets_it(monkeypatch):
    from services.common import logs, tracing, worker_base
    from services.common.roles import WorkerRole
    from services.common.settings import SettingsError
    from services.common.worker_settings import parse_worker_settings

    monkeypatch.setenv("TANDEM_WORKER_DRAIN_S", "60")
    assert parse_worker_settings("decode", ["--model", "/m"]).drain_s == 60.0
    assert parse_worker_settings("decode", ["--model", "/m", "--drain-s", "5"]).drain_s == 5.0  # the flag wins
    monkeypatch.setenv("TANDEM_WORKER_DRAIN_S", "-1")
    with pytest.raises(SettingsError, match="drain_s must be >= 0"):
        parse_worker_settings("decode", ["--model", "/m"])
    served = []

    async def serve(settings, service_cls):
        served.append(settings.drain_s)

    monkeypatch.setattr(worker_base, "serve_worker", serve)
    monkeypatch.setattr(logs, "setup_logging", lambda role: None)
    monkeypatch.setattr(tracing, "setup_tracing", lambda role: False)
    monkeypatch.setenv("TANDEM_WORKER_DRAIN_S", "42")
    assert worker_base.main_for(WorkerRole.DECODE, worker_base.WorkerService, ["--model", "/m"]) == 0
    assert served == [42.0]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_prestop_command_waits_until_the_router_stops_listing_the_worker():
    from tandem.worker_drain import wait_deregistered

    answers = iter([{"decode-a", "decode-b"}, ConnectionError("router restarting"), {"decode-a"}, {"decode-b"}])

    def listed():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    clock = Clock()
    assert wait_deregistered("decode-a", listed, timeout_s=10, clock=clock, sleep=clock.sleep) is True
    assert clock.now == pytest.approx(0.6)  # three polls of 0.2 s: listed, unreachable, listed


def test_the_prestop_command_gives_up_when_the_router_keeps_listing_it():
    from tandem.worker_drain import wait_deregistered

    clock = Clock()
    assert wait_deregistered("decode-a", lambda: {"decode-a"}, timeout_s=1, clock=clock, sleep=clock.sleep) is False
    assert 1.0 <= clock.now < 1.3


def test_the_prestop_command_signals_the_worker_and_says_why_it_cannot(monkeypatch, capsys):
    import subprocess
    import sys

    from tandem import worker_drain
    from tandem.cli import main

    assert main(["worker", "drain", "--worker-id", ""]) == 2
    assert "the worker's id is required" in capsys.readouterr().err
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\nprint('up', flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout.readline() == "up\n"
    monkeypatch.setattr(worker_drain, "router_worker_ids", lambda address: lambda: set())
    assert main(["worker", "drain", "--worker-id", "decode-a", "--pid", str(worker.pid)]) == 0
    assert worker.wait(timeout=10) == 7  # it got SIGTERM
    assert "decode-a deregistered" in capsys.readouterr().out
    assert main(["worker", "drain", "--worker-id", "decode-a", "--pid", str(worker.pid)]) == 1  # gone now
    assert f"cannot signal process {worker.pid}" in capsys.readouterr().err
