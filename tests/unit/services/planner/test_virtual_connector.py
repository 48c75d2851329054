"""The virtual connector over a fake cluster: starts after the delay, drains before retiring, counts GPU time
from the ask to the end of the drain, and gives up starting replicas before serving ones."""

from services.planner.connectors.virtual import VirtualConnector
from services.planner.types import Replicas, WorkerRole

P, D = WorkerRole.PREFILL, WorkerRole.DECODE


class FakeCluster:
    def __init__(self):
        self.serving: dict[str, WorkerRole] = {}
        self.removed: list[str] = []
        self.busy: set[str] = set()

    def add_worker(self, role):
        worker_id = f"{role.value}-{len(self.serving)}"
        self.serving[worker_id] = role
        return worker_id

    def remove_worker(self, worker_id):
        self.removed.append(worker_id)

    def is_drained(self, worker_id):
        return worker_id not in self.busy


def connector(delay=10.0):
    clock = {"now": 0.0}
    cluster = FakeCluster()
    c = VirtualConnector(cluster, lambda: clock["now"], start_delay_s=delay)
    c.adopt(D, cluster.add_worker(D))
    return c, cluster, clock


def test_a_new_replica_serves_after_the_start_delay():
    c, cluster, clock = connector()
    c.scale(D, 3)
    assert c.replicas()[D] == Replicas(ready=1, starting=2)
    clock["now"] = 9.9
    assert c.replicas()[D] == Replicas(ready=1, starting=2)
    clock["now"] = 10.0
    assert c.replicas()[D] == Replicas(ready=3) and len(cluster.serving) == 3
    assert c.replicas()[P] == Replicas()


def test_scaling_down_cancels_starting_replicas_first_then_drains_the_newest():
    c, cluster, clock = connector()
    c.scale(D, 2)
    clock["now"] = 10.0
    c.scale(D, 3)  # one more, still loading
    c.scale(D, 1)
    assert cluster.removed == ["decode-1"]  # the loading one went at once, then the newest serving one
    cluster.busy.add("decode-1")
    assert c.replicas()[D] == Replicas(ready=1, draining=1)
    cluster.busy.clear()
    clock["now"] = 12.0
    assert c.replicas()[D] == Replicas(ready=1)


def test_gpu_hours_count_from_the_ask_to_the_end_of_the_drain():
    c, cluster, clock = connector(delay=100.0)
    c.scale(D, 2)  # asked at 0, serves at 100
    clock["now"] = 100.0
    c.replicas()
    cluster.busy.add("decode-1")
    clock["now"] = 1800.0
    c.scale(D, 1)  # draining until 3600
    clock["now"] = 3600.0
    cluster.busy.clear()
    c.replicas()
    assert c.gpu_hours(3600.0) == 1.0 + 1.0  # the first worker all along, the second from its ask to its exit
    clock["now"] = 7200.0
    assert c.gpu_hours(7200.0) == 2.0 + 1.0
