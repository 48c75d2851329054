"""The decode worker's KV gate: a verified handle must also name a prefill worker the router has registered at that
address; the router's pool is cached and asked again only when stale or on a rate-limited miss."""

import pytest

from services.common.kv_signing import HandleNotTrusted, KvSigner, KvVerifier
from services.common.protos import common_pb2, router_pb2
from services.decode import kv_gate
from services.decode.kv_gate import KvGate, PrefillPool

KEY = b"k" * 32
TOKENS = tuple(range(20))


class FakeRouter:
    def __init__(self, workers):
        self.workers, self.num_calls = workers, 0

    async def ListWorkers(self, request, timeout):
        self.num_calls += 1
        return router_pb2.ListWorkersResponse(
            workers=[
                router_pb2.WorkerStatus(worker=router_pb2.WorkerInfo(worker_id=w, role=role, address=a))
                for w, a, role in self.workers
            ]
        )


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def pool_with(router, clock) -> PrefillPool:
    pool = PrefillPool("127.0.0.1:1", clock=clock)
    pool._stub = lambda address: router
    return pool


def handle(worker_id="prefill-0", address="127.0.0.1:5001", req_id="r1") -> common_pb2.KvHandle:
    h = common_pb2.KvHandle(
        worker_id=worker_id,
        address=address,
        req_id=req_id,
        num_tokens=20,
        num_blocks=2,
        lease_expires_unix_s=2e9,
        layout=common_pb2.KvLayout(block_size=16),
    )
    KvSigner(KEY).seal(h, TOKENS)
    return h


PREFILL, DECODE = common_pb2.WORKER_ROLE_PREFILL, common_pb2.WORKER_ROLE_DECODE


async def test_a_registered_prefill_worker_passes_and_the_pool_is_cached():
    router = FakeRouter([("prefill-0", "127.0.0.1:5001", PREFILL)])
    gate = KvGate(KvVerifier(KEY), pool_with(router, Clock()), clock=lambda: 1e9)
    await gate.admit(handle(req_id="a"), TOKENS)
    await gate.admit(handle(req_id="b"), TOKENS)
    assert router.num_calls == 1


@pytest.mark.parametrize(
    "worker_id,address",
    [
        ("prefill-0", "127.0.0.1:6666"),  # a signed handle naming an unregistered address
        ("prefill-7", "127.0.0.1:5001"),  # another id at a registered address
        ("decode-0", "127.0.0.1:5002"),  # a registered worker, but not a prefill worker
    ],
)
async def test_a_source_the_router_does_not_list_as_a_prefill_worker_is_refused(worker_id, address):
    router = FakeRouter([("prefill-0", "127.0.0.1:5001", PREFILL), ("decode-0", "127.0.0.1:5002", DECODE)])
    gate = KvGate(KvVerifier(KEY), pool_with(router, Clock()), clock=lambda: 1e9)
    with pytest.raises(HandleNotTrusted) as info:
        await gate.admit(handle(worker_id, address), TOKENS)
    assert info.value.reason == "unregistered_source"


async def test_misses_ask_the_router_at_most_every_half_second_and_wait_for_their_turn():
    router, clock = FakeRouter([]), Clock()
    slept = []

    async def sleep(seconds):
        slept.append(seconds)
        clock.t += seconds

    pool = PrefillPool("127.0.0.1:1", clock=clock, sleep=sleep)
    pool._stub = lambda address: router
    assert not await pool.is_registered("prefill-0", "a:1")  # the first look: stale, then a miss that waits
    assert router.num_calls == 2 and slept == [kv_gate.MISS_REFRESH_S]
    router.workers = [("prefill-0", "a:1", PREFILL)]  # registered just after the last look
    clock.t += 0.1
    assert await pool.is_registered("prefill-0", "a:1")  # waits out the rest of the half second, then sees it
    assert router.num_calls == 3 and slept[-1] == pytest.approx(kv_gate.MISS_REFRESH_S - 0.1)
    assert await pool.is_registered("prefill-0", "a:1")  # cached
    assert router.num_calls == 3


async def test_a_deregistered_worker_is_forgotten_once_the_cache_is_stale():
    router, clock = FakeRouter([("prefill-0", "a:1", PREFILL)]), Clock()
    pool = pool_with(router, clock)
    assert await pool.is_registered("prefill-0", "a:1")
    router.workers = []
    clock.t += kv_gate.POOL_TTL_S + 0.01
    assert not await pool.is_registered("prefill-0", "a:1")


async def test_a_forged_handle_never_reaches_the_router():
    router = FakeRouter([("prefill-0", "127.0.0.1:5001", PREFILL)])
    gate = KvGate(KvVerifier(KEY), pool_with(router, Clock()), clock=lambda: 1e9)
    forged = handle()
    forged.signature = bytes(32)
    with pytest.raises(HandleNotTrusted):
        await gate.admit(forged, TOKENS)
    assert router.num_calls == 0
