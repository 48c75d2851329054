"""KV-aware routing on a live stack: the router's kv policy follows two decode workers' KV events (native and
simulated engines), sends requests that share a prefix to the worker caching it, and forgets a worker that died:
its blocks leave the prefix index."""

import re

import httpx
import pytest

from services.common.identity import Identity
from services.common.protos import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.integration.conftest import all_worker_stats, running_stack, workers
from tests.integration.helpers import wait_for

SHARED = list(range(1, 65))  # 4 full blocks of 16 (native), 1 of 64 (the sim's H100 profile)
# NOTE: predictions last 1 ms, so only the workers' KV events can explain requests sticking together
ROUTER_ARGS = (
    "--policy",
    "kv",
    "--kv-predict-ttl-s",
    "0.001",
    "--lease-ttl-s",
    "3",
    "--heartbeat-interval-s",
    "0.5",
    "--sweep-interval-s",
    "0.2",
)


def route(stack, model: str, token_ids: list[int]) -> router_pb2.RouteResponse:
    # NOTE: Route and Complete are the gateway's calls (mutual TLS, per-role authorization)
    with stack.channel(f"127.0.0.1:{stack.router_port}", Identity("gateway", "gateway-test")) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        reply = stub.Route(router_pb2.RouteRequest(req_id="probe", model=model, token_ids=token_ids), timeout=5)
        stub.Complete(router_pb2.CompleteRequest(req_id="probe"), timeout=5)
    return reply


def indexed_blocks(stack) -> dict[str, int]:
    """tandem_router_kv_index_blocks per worker, from the router's /metrics."""
    text = httpx.get(stack.metrics_urls["router"], timeout=5).text
    return {
        w: int(float(n))
        for w, n in re.findall(r'^tandem_router_kv_index_blocks\{worker_id="([^"]+)"\} (\S+)$', text, re.M)
    }


@pytest.mark.parametrize("engine", ["native", "sim"])
def test_shared_prefix_sticks_to_one_worker_and_a_dead_worker_is_forgotten(tiny_stack_model, tmp_path, engine):
    with (
        running_stack(
            tiny_stack_model, tmp_path, num_prefill=0, num_decode=2, engine=engine, router_args=ROUTER_ARGS
        ) as stack,
        httpx.Client(timeout=60) as http,
    ):
        for i in range(4):
            prompt = SHARED + [100 + i] * 8
            response = http.post(
                stack.url + "/v1/completions",
                json={"model": tiny_stack_model.name, "prompt": prompt, "max_tokens": 4, "temperature": 0},
            )
            assert response.status_code == 200, response.text
        stats = all_worker_stats(stack)
        busy = sorted(w for w, s in stats.items() if s.num_generated_tokens > 0)
        assert len(busy) == 1, {w: s.num_generated_tokens for w, s in stats.items()}
        (chosen,) = busy
        assert stats[chosen].num_generated_tokens == 16
        assert stats[chosen].prefix_hits > 0
        held = wait_for(lambda: indexed_blocks(stack), lambda got: got.get(chosen, 0) > 0, 10, "KV events indexed")

        # an operator's reset travels as a CLEARED event: the index forgets the worker's blocks, then relearns
        address = next(w.worker.address for w in workers(stack) if w.worker.worker_id == chosen)
        with stack.channel(address) as channel:  # this process: the stack's operator
            reply = worker_pb2_grpc.WorkerControlStub(channel).ResetPrefixCache(
                worker_pb2.ResetPrefixCacheRequest(), timeout=10
            )
        assert reply.num_blocks_dropped >= held[chosen]
        wait_for(lambda: indexed_blocks(stack), lambda got: chosen not in got, 10, "CLEARED reaching the index")
        response = http.post(
            stack.url + "/v1/completions",
            json={"model": tiny_stack_model.name, "prompt": SHARED + [99] * 8, "max_tokens": 4, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        held = wait_for(lambda: indexed_blocks(stack), lambda got: got.get(chosen, 0) > 0, 10, "blocks relearned")
        model = workers(stack)[0].worker.model
        probe = route(stack, model, SHARED + [7] * 8)  # the prefix index, fed only by KV events, knows
        assert (probe.decode.worker_id, probe.num_cached_tokens) == (chosen, len(SHARED))

        child = next(c for c in stack.children if c.name == chosen)
        child.proc.kill()
        child.proc.wait()
        wait_for(
            lambda: [w.worker.worker_id for w in workers(stack)],
            lambda ids: chosen not in ids,
            15,
            f"{chosen} expiring",
        )
        probe = route(stack, model, SHARED + [7] * 8)
        assert (probe.decode.worker_id != chosen, probe.num_cached_tokens) == (True, 0)
        # the sweep forgets it in the index too: its blocks are gone, the other worker's stay
        after = wait_for(lambda: indexed_blocks(stack), lambda got: chosen not in got, 10, "the index forgetting it")
        assert {w: n for w, n in held.items() if w != chosen} == after
