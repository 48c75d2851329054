"""The router hashes a prompt under the request's cache salt (and the deployment secret), as the workers do: a
tenant's own cached prefix counts, another tenant's identical prompt does not."""

from engines.base.block_hash import NONE_HASH, chain_block_hashes, chain_root
from engines.base.events import KvEvent, KvEventKind, KvTier
from services.common.protos import router_pb2
from services.router.convert import route_input_from_pb
from services.router.kv_policy import KvAwarePolicy, KvPolicyConfig
from services.router.prefix_index import PrefixIndex
from services.router.types import RouteInput
from tests.unit.services.router.helpers import FakeClock, view

BS = 4
PROMPT = tuple(range(1000, 1020))  # 5 full blocks
SECRET = "deployment-secret"
ROOT_A = chain_root("tenant-a", SECRET)


def _policy() -> KvAwarePolicy:
    index = PrefixIndex()  # w1 holds tenant a's prompt, as its worker's salted events say
    index.apply(
        "w1", [KvEvent(1, KvEventKind.STORED, NONE_HASH, tuple(chain_block_hashes(PROMPT, BS, ROOT_A)), KvTier.DEVICE)]
    )
    return KvAwarePolicy(index, FakeClock(), None, KvPolicyConfig(block_size=BS, use_events=True))


def _overlap(request: RouteInput) -> dict[str, int]:
    return {s.view.worker_id: s.num_overlap_blocks for s in _policy().scores(request, [view("w1"), view("w2")])}


def test_the_router_matches_a_tenants_own_prefix_only():
    assert _overlap(RouteInput("a", "m", PROMPT, hash_root=ROOT_A)) == {"w1": 5, "w2": 0}
    assert _overlap(RouteInput("b", "m", PROMPT, hash_root=chain_root("tenant-b", SECRET))) == {"w1": 0, "w2": 0}
    assert _overlap(RouteInput("u", "m", PROMPT)) == {"w1": 0, "w2": 0}


def test_route_requests_derive_the_root_from_the_salt_and_the_routers_secret():
    msg = router_pb2.RouteRequest(req_id="r", model="m", token_ids=PROMPT, cache_salt="tenant-a")
    assert route_input_from_pb(msg, SECRET).hash_root == ROOT_A
    assert route_input_from_pb(msg, "another-secret").hash_root != ROOT_A
    assert route_input_from_pb(router_pb2.RouteRequest(req_id="r", model="m")).hash_root == NONE_HASH


def test_the_router_reads_the_shared_secret_and_hides_it(monkeypatch):
    from services.router.settings import RouterSettings

    monkeypatch.setenv("TANDEM_KV_HASH_SECRET", "hunter2")
    settings = RouterSettings.from_env()
    assert settings.kv_hash_secret == "hunter2" and "hunter2" not in repr(settings)
