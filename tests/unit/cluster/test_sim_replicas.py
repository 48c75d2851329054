"""Router replicas in the simulator: every replica follows every worker's events and load, arrivals spread over
them, each request completes where it was routed; replicas keep kv's prefix reuse on a small conversation trace;
the verdicts compare with one router and can fail."""

from engines.timing.profile import load_profile
from tandem.cluster.des import ClusterSim, SimConfig
from tandem.cluster.metrics import Slo, summarize
from tandem.cluster.replicas import replica_verdicts
from tests.unit.cluster.test_des import conversations

PROFILE = load_profile()


def run(num_routers: int, policy: str = "kv") -> tuple[ClusterSim, dict]:
    sim = ClusterSim(PROFILE, SimConfig(4, num_routers=num_routers), policy)
    return sim, summarize(sim, sim.run(conversations(60, 6)), Slo(), 0.0)


def test_replicas_follow_every_worker_and_release_what_they_routed():
    sim, result = run(4)
    assert result["num_finished"] == 60
    replicas = sim.routers.replicas
    sizes = [len(r.index) for r in replicas]
    assert sizes[0] > 0 and len(set(sizes)) == 1  # the same KV events reached every replica
    assert all(r.registry.num_inflight() == 0 for r in replicas)  # each completion went to its router
    routed = [sum(v.num_inflight for v in r.registry.views()) for r in replicas]
    assert routed == [0, 0, 0, 0]
    assert len({tuple(v.load for v in r.registry.views()) for r in replicas}) == 1  # the same loads too


def test_replicas_keep_kvs_prefix_reuse_on_conversations():
    one, two, four = (run(n)[1] for n in (1, 2, 4))
    _, rr = run(1, "round_robin")
    assert one["prefix_hit_rate"] > rr["prefix_hit_rate"] + 0.1
    for many in (two, four):  # every turn of a conversation still finds the worker holding its history
        assert many["prefix_hit_rate"] == one["prefix_hit_rate"]


def fake_run(hit_rate: float, per_worker: list[int]) -> dict:
    return {
        "prefix_hit_rate": hit_rate,
        "load_per_worker": {f"w{i}": {"num_requests": n} for i, n in enumerate(per_worker)},
    }


def test_verdicts_fail_on_lost_hits_or_herding():
    policies = {
        "kv@1r": fake_run(0.50, [25, 25, 25, 25]),
        "kv@2r": fake_run(0.495, [28, 24, 24, 24]),
        "kv@4r": fake_run(0.48, [25, 25, 25, 25]),
    }
    verdicts = replica_verdicts(policies, ["kv"], [1, 2, 4])
    assert verdicts["kv@2r"]["meets_target"] and round(verdicts["kv@2r"]["busiest_ratio"], 2) == 1.12
    assert not verdicts["kv@4r"]["meets_target"]  # 4% of the hits lost
    policies["kv@2r"] = fake_run(0.50, [40, 20, 20, 20])  # one worker herded onto: 0.40 vs 0.25
    assert not replica_verdicts(policies, ["kv"], [1, 2])["kv@2r"]["meets_target"]
