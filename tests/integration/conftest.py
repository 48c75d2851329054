"""Real stacks on loopback: router, workers and gateway as separate processes (tandem.launcher),
on free ports, stopped after use."""

import contextlib
from pathlib import Path

import pytest

from services.common.grpc_server import make_sync_channel
from services.common.protos import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.launcher import Stack, StackConfig, free_port
from tandem.stack_run import make_stack


@contextlib.contextmanager
def running_stack(model: Path, tmp_path: Path, **kw):
    kw.setdefault("num_threads", 1)
    kw.setdefault("worker_args", ("--num-blocks", "512", "--max-num-batched-tokens", "1024"))
    cfg = StackConfig(model=str(model), port=free_port(), log_dir=tmp_path / "logs", ready_timeout_s=120, **kw)
    stack = make_stack(cfg)
    try:
        stack.start()
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()


def workers(stack: Stack) -> list:
    with make_sync_channel(f"127.0.0.1:{stack.router_port}") as channel:
        reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=5)
    return list(reply.workers)


def worker_stats(address: str) -> worker_pb2.WorkerStats:
    with make_sync_channel(address) as channel:
        return worker_pb2_grpc.WorkerControlStub(channel).GetStats(worker_pb2.GetStatsRequest(), timeout=5)


def all_worker_stats(stack: Stack) -> dict[str, worker_pb2.WorkerStats]:
    return {w.worker.worker_id: worker_stats(w.worker.address) for w in workers(stack)}


@pytest.fixture(scope="module")
def tiny_stack_model(tmp_path_factory) -> Path:
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-stack"), "llama", tiny=True, seed=0)


ENDLESS_CONTEXT = 4096


@pytest.fixture(scope="session")
def endless_model(tmp_path_factory) -> Path:
    """The tiny checkpoint with no EOS anywhere (config and generation_config) and a longer context:
    every request runs to max_tokens, the gateway's only way to get ignore_eos."""
    import json

    from tandem.models.init import init_model

    out = init_model(
        tmp_path_factory.mktemp("endless"),
        "llama",
        tiny=True,
        seed=0,
        overrides={"eos_token_id": None, "max_position_embeddings": ENDLESS_CONTEXT},
    )
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen.pop("eos_token_id")
    gen_path.write_text(json.dumps(gen))
    return out
