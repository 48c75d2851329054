"""`tandem up --gateway-workers N` reaches the gateway's command line; without it the environment decides."""

import tandem.launcher as launcher
import tandem.stack_run as stack_run
from tandem.cli import main


def test_up_passes_gateway_workers_to_the_gateway(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(stack_run, "run_stack", lambda cfg: seen.append(cfg) or 0)
    assert main(["up", "--model", str(tmp_path), "--gateway-workers", "3"]) == 0
    assert main(["up", "--model", str(tmp_path)]) == 0
    with_flag, without = seen
    assert (with_flag.num_gateway_workers, without.num_gateway_workers) == (3, None)
    assert launcher.Stack(with_flag)._gateway_workers_args() == ["--workers", "3"]
    assert launcher.Stack(without)._gateway_workers_args() == []  # TANDEM_GATEWAY_WORKERS, else 1
