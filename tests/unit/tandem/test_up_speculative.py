"""`tandem up --speculative`: every worker of the local stack gets the setting (the live stacks in
tests/integration/test_speculative_live.py run with exactly these worker arguments); without it, none."""

import pytest

import tandem.stack_run
from tandem.cli import main


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        (["--speculative", "ngram"], ("--speculative", "ngram")),
        (["--speculative", "draft:/models/draft8"], ("--speculative", "draft:/models/draft8")),
        ([], ()),
    ],
)
def test_the_setting_reaches_every_worker(monkeypatch, tmp_path, flag, expected):
    seen = []
    monkeypatch.setattr(tandem.stack_run, "run_stack", lambda cfg: seen.append(cfg) or 0)
    monkeypatch.delenv("TANDEM_WORKER_SPECULATIVE", raising=False)
    assert main(["up", "--model", str(tmp_path), "--prefill", "1", *flag]) == 0
    args = seen[0].worker_args
    spec = tuple(args[args.index("--speculative") :][:2]) if "--speculative" in args else ()
    assert spec == expected and seen[0].num_prefill == 1
