"""The tandem/ helpers read the worker's own settings fields (variable names and defaults), not copies of them."""

from tandem.cli import build_parser


def test_worker_drain_reads_the_workers_id_and_router(monkeypatch):
    monkeypatch.setenv("TANDEM_WORKER_WORKER_ID", "decode-7")
    monkeypatch.setenv("TANDEM_WORKER_ROUTER_ADDRESS", "router:1")
    args = build_parser().parse_args(["worker", "drain"])
    assert (args.worker_id, args.router_address) == ("decode-7", "router:1")


def test_worker_drain_defaults_are_the_workers(monkeypatch):
    monkeypatch.delenv("TANDEM_WORKER_WORKER_ID", raising=False)
    monkeypatch.delenv("TANDEM_WORKER_ROUTER_ADDRESS", raising=False)
    args = build_parser().parse_args(["worker", "drain"])
    assert (args.worker_id, args.router_address) == ("", "127.0.0.1:50051")


def test_up_takes_the_workers_variables(monkeypatch):
    monkeypatch.setenv("TANDEM_WORKER_KV_DISK_DIR", "/kv")
    monkeypatch.setenv("TANDEM_WORKER_SPECULATIVE", "ngram")
    monkeypatch.setenv("TANDEM_MODEL", "/m")
    args = build_parser().parse_args(["up"])
    assert (args.kv_disk_dir, args.speculative, args.model) == ("/kv", "ngram", "/m")
