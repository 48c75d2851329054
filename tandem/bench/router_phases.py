"""Where one array-scored Route decision spends its time: `RouterCore.route`'s array path replayed call by call
with a timer between calls, over the state `tandem bench router` builds. A profiler only: its picks are checked
against the real path's, and its total against the real path's time, in the same run.

Also the compiled kernels' cold start, in fresh processes (the only I/O here: numba's cache directory).
It reads the router's internals: the point is to time them one by one.
"""

import itertools
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from engines.base.block_hash import num_blocks_for
from services.router.array_scoring import decide_row
from services.router.types import RouteDecision, RouteInput, WorkerRole

# (phase, what it covers), in the order the decision runs them
PHASES = (
    ("checks", "RouteInput.validate, exclusions, quarantine"),
    ("group_arrays", "the registry's arrays for the group (rows dirtied since the last decision refilled)"),
    ("hash_keys", "the prompt's block hashes (the gateway's) as a uint64 array"),
    ("recent_routes", "RecentRoutes' compiled table: each worker's blocks routed to it lately, into the group"),
    ("compiled_decide", "one compiled call: index match (prefix depth per slot), busy check, kv cost, pick"),
    ("bookkeeping", "deferring the LRU touch and the recent-route record"),
    ("chosen_view", "the chosen worker's WorkerView (the reply's address)"),
    ("disaggregation", "prefill candidates and the disaggregation check"),
    ("add_inflight", "counting the route against the worker"),
    ("decision", "the RouteDecision"),
)


def decide_in_phases(core, request: RouteInput, ns: list[int]) -> RouteDecision:
    """`core.route(request)` on the array path, appending each phase's nanoseconds to `ns` (len(PHASES) values)."""
    clock, policy, registry = time.perf_counter_ns, core.policy, core.registry
    t = [clock()]
    request.validate()
    assert not request.exclude_worker_ids and not registry.has_quarantine()
    t.append(clock())
    group = registry.arrays(request.model, WorkerRole.DECODE)
    if group.index_epoch != policy.index.epoch:  # once: what `choose_arrays` does when a slot changed
        group.index_slots, group.index_epoch = policy.index.slots_for(group.worker_ids), policy.index.epoch
    t.append(clock())
    block_size = group.block_size
    hashes = policy.prompt_hashes(request, block_size)
    keys = np.fromiter(hashes, np.uint64, len(hashes))
    t.append(clock())
    policy.recent_overlap_into(keys, group)
    t.append(clock())
    row, overlap, deepest = decide_row(
        *policy.index.kernel_args(),
        keys,
        policy._depths,
        group.index_slots,
        group.predicted,
        group.state,
        float(core.busy.load),
        float(core.busy.kv),
        float(policy._clock()),
        num_blocks_for(len(request.token_ids), block_size),
        block_size,
        float(policy.config.overlap_weight),
        float(policy.config.inflight_weight),
    )
    t.append(clock())
    worker_id = group.worker_ids[row]
    assert policy.index.touch_later(hashes, deepest)
    policy.predicted.record_later(hashes, worker_id)
    t.append(clock())
    view = registry.view(worker_id)
    t.append(clock())
    num_cached = int(overlap) * block_size
    split = core.disagg.decide(request, core.candidates(request, WorkerRole.PREFILL), num_cached)
    t.append(clock())
    num_tokens = len(request.token_ids)
    chosen = [worker_id] + ([split.prefill.worker_id] if split.prefill else [])
    registry.add_inflight(request.req_id, chosen, num_tokens, max(num_tokens - num_cached, 0))
    t.append(clock())
    decision = RouteDecision(view, split.prefill, policy.name, num_cached, split.reason)
    t.append(clock())
    ns.extend(b - a for a, b in itertools.pairwise(t))
    return decision


_LOAD_KERNELS = """
import time
start = time.perf_counter()
from services.router.policy import make_policy
imported = time.perf_counter()
make_policy("kv")
print(imported - start, time.perf_counter() - imported, time.process_time())
"""


def cold_start() -> dict[str, float]:
    """Seconds to compile the router's kernels in a fresh process with an empty numba cache, then to load them from
    that cache in another fresh process (what every later router start pays); CPU seconds of each process too."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="tandem-numba-") as cache_dir:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
        for name in ("compile", "cached"):
            out = subprocess.run(
                [sys.executable, "-c", _LOAD_KERNELS], env=env, check=True, capture_output=True, text=True
            ).stdout.split()
            found[f"import_s_{name}"], found[f"kernels_s_{name}"], found[f"cpu_s_{name}"] = map(float, out)
    return found
