"""EngineCore through its public API (add, step, abort, a KV load, stats) over a fake runner: what each request
gets, in which step, with which blocks; preemption under block pressure and the requeue after a load. Also the
scheduler as the only writer of its queues (an AST scan of every other module)."""

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines.base.engine_configs import BatchConfig
from engines.base.errors import InvalidRequestError
from engines.base.types import EngineRequest, FinishReason, KvExport, KvLayout, SamplingParams
from engines.core.engine_core import CoreConfig, EngineCore
from engines.core.loads import KvLoad, LoadDone
from engines.core.runner import Done, RunnerInfo
from engines.core.sequence import SequenceStatus

BS = 4
NEXT = 7
ROOT = Path(__file__).resolve().parents[4]


@dataclass(frozen=True)
class Source:
    token_ids: tuple[int, ...]


class FakeRunner:
    """Samples NEXT; records each step's (req_id, start, num_new_tokens) and the loads started; ends loads when a
    test says so."""

    def __init__(self, num_blocks: int):
        self.info = RunnerInfo(KvLayout(1, 1, 1, "float32", BS), num_blocks, 1024, 1000)
        self.steps: list[list[tuple[str, int, int]]] = []
        self.started: list[KvLoad] = []
        self.ended: list[LoadDone] = []

    def launch(self, out):
        self.steps.append([(s.seq.req_id, s.start, s.num_new_tokens) for s in out.scheduled])
        return Done([(NEXT, None)] * len(out.sampling))

    def step_duration(self, out) -> float:
        return 0.0

    def start_load(self, load: KvLoad) -> None:
        self.started.append(load)

    def poll_loads(self) -> list[LoadDone]:
        ended, self.ended = self.ended, []
        return ended

    def kv_source(self, kv_params: bytes) -> Source:
        return Source(tuple(range(int(kv_params))))


def make_core(num_blocks: int = 16, max_num_seqs: int = 8, budget: int = 64) -> EngineCore:
    return EngineCore(CoreConfig(BatchConfig(max_num_seqs, budget)), FakeRunner(num_blocks))


def request(req_id: str, tokens, max_tokens: int = 2) -> EngineRequest:
    return EngineRequest(req_id, tuple(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def importing(req_id: str, num_tokens: int, num_loaded: int) -> EngineRequest:
    """A request whose first `num_loaded` tokens' KV is loaded from elsewhere (a handle names the source)."""
    return EngineRequest(
        req_id,
        tuple(range(num_tokens)),
        SamplingParams(max_tokens=1, ignore_eos=True),
        kv=str(num_loaded).encode(),
    )


def test_add_then_step_prefills_then_decodes_until_max_tokens():
    core = make_core()
    core.add(request("a", range(10), max_tokens=3))
    first = core.step()
    assert [(o.req_id, o.new_token_ids, o.finish_reason) for o in first] == [("a", (NEXT,), None)]
    core.step()
    last = core.step()
    assert [(o.new_token_ids, o.finish_reason, o.num_prompt_tokens) for o in last] == [
        ((NEXT,), FinishReason.LENGTH, 10)
    ]
    assert core.runner.steps == [[("a", 0, 10)], [("a", 10, 1)], [("a", 11, 1)]]
    assert not core.has_work and core.block_manager.num_free_blocks == 16 and "a" not in core.seqs


def test_a_live_request_id_is_refused():
    core = make_core()
    core.add(request("a", range(5)))
    with pytest.raises(InvalidRequestError):
        core.add(request("a", range(5)))


def test_the_token_budget_chunks_a_prefill_beside_running_decodes():
    core = make_core(budget=8)
    core.add(request("a", range(4), max_tokens=4))
    core.step()
    core.add(request("b", range(100, 120)))
    core.step()
    assert core.runner.steps == [[("a", 0, 4)], [("a", 4, 1), ("b", 0, 7)]]


def test_abort_ends_a_waiting_or_running_request_and_frees_its_blocks():
    core = make_core()
    core.add(request("run", range(10), max_tokens=8))
    core.step()
    core.add(request("wait", range(20, 30)))
    out = core.abort("run")
    assert (out.req_id, out.finish_reason) == ("run", FinishReason.ABORT)
    assert core.abort("wait").finish_reason is FinishReason.ABORT
    assert core.abort("nobody") is None
    assert not core.has_work and core.block_manager.num_free_blocks == 16
    assert core.step() == []


def test_block_pressure_preempts_the_latest_admitted_and_requeues_it_at_the_head():
    core = make_core(num_blocks=4)
    core.add(request("a", range(7), max_tokens=4))  # 2 blocks, its 2nd block has room for 1 more token
    core.add(request("b", range(100, 107), max_tokens=4))
    core.step()  # both admitted: 4 blocks used
    core.step()  # both decode their 8th token into their 2nd block
    assert core.block_manager.num_free_blocks == 0
    core.step()  # a's 9th token needs a block: b (admitted last) is preempted, its blocks go to a
    assert core.stats().num_preemptions == 1
    assert core.seqs["b"].status is SequenceStatus.WAITING and core.seqs["b"].block_table == []
    assert list(core.scheduler.waiting) == [core.seqs["b"]]
    outs = []
    for _ in range(20):
        outs += core.step()
        if not core.has_work:
            break
    done = {o.req_id: o for o in outs if o.finished}
    assert done["a"].finish_reason is FinishReason.LENGTH and done["b"].finish_reason is FinishReason.LENGTH
    # b comes back when a is done: its first block is a prefix hit, the rest (and its token) is computed again
    assert core.runner.steps == [
        [("a", 0, 7), ("b", 0, 7)],
        [("a", 7, 1), ("b", 7, 1)],
        [("a", 8, 1)],
        [("a", 9, 1)],
        [("b", 4, 5)],
        [("b", 9, 1)],
    ]


def test_an_import_loads_off_the_queues_then_requeues_ahead_of_requests_holding_no_blocks():
    core = make_core(max_num_seqs=1)
    core.add(request("busy", range(900, 905), max_tokens=5))
    core.step()  # "busy" holds the one running slot
    core.add(importing("loaded", 12, 8))
    seq = core.seqs["loaded"]
    assert core.runner.started == [KvLoad("loaded", (2, 3), 8, Source(tuple(range(8))))]
    assert seq.status is SequenceStatus.LOADING and seq not in core.scheduler.waiting
    core.add(request("fresh", range(300, 306)))
    assert core.stats().num_waiting == 2 and core.has_loads
    core.runner.ended = [LoadDone("loaded", True)]
    core.poll_loads()
    assert [s.req_id for s in core.scheduler.waiting] == ["loaded", "fresh"]
    assert seq.status is SequenceStatus.WAITING and seq.num_computed_tokens == 8 and not core.has_loads
    while core.has_work:
        core.step()
    assert ("loaded", 8, 4) in [s for step in core.runner.steps for s in step]  # only what the load did not bring


def test_bytes_and_a_handle_import_the_same_way_one_load_each_through_the_runner():
    core = make_core()
    kv = KvExport(core.info.kv_layout, tuple(range(8)), 2, bytes(64))
    core.add(EngineRequest("bytes", tuple(range(12)), SamplingParams(max_tokens=1, ignore_eos=True), kv=kv))
    core.add(importing("handle", 12, 8))
    assert core.runner.started == [
        KvLoad("bytes", (0, 1), 8, kv),
        KvLoad("handle", (2, 3), 8, Source(tuple(range(8)))),
    ]
    assert all(core.seqs[r].status is SequenceStatus.LOADING for r in ("bytes", "handle"))
    core.runner.ended = [LoadDone("bytes", True), LoadDone("handle", True)]
    while core.has_work or core.has_loads:
        core.step()
    assert core.runner.steps == [[("bytes", 8, 4), ("handle", 8, 4)]]  # the same step: neither computes its KV


def test_a_failed_import_computes_its_tokens_and_an_aborted_one_frees_its_blocks_when_the_load_ends():
    core = make_core()
    core.add(importing("a", 10, 8))
    core.add(importing("b", 10, 8))
    core.runner.ended = [LoadDone("a", False, "broken")]
    core.poll_loads()
    assert core.seqs["a"].block_table == [] and core.seqs["a"].status is SequenceStatus.WAITING
    assert core.abort("b").finish_reason is FinishReason.ABORT
    assert core.block_manager.num_free_blocks == 14  # b's 2 blocks are still being written
    core.runner.ended = [LoadDone("b", True)]
    core.poll_loads()
    assert core.block_manager.num_free_blocks == 16
    core.step()
    assert core.runner.steps == [[("a", 0, 10)]]


def test_an_import_waits_for_blocks_in_the_schedulers_queue_counted_as_waiting_and_starts_in_order():
    core = make_core(num_blocks=6)
    core.add(request("busy", range(900, 912), max_tokens=8))
    core.step()  # "busy" holds 3 blocks and may grow to 5: 3 are free
    core.add(importing("first", 12, 8))  # may grow to 13 tokens: 4 blocks, only 3 free
    core.add(importing("second", 8, 4))
    first, second = core.seqs["first"], core.seqs["second"]
    assert [s for s, _ in core.scheduler.importing] == [first, second] and core.runner.started == []
    assert first.status is SequenceStatus.LOADING and core.stats().num_waiting == 2 and core.has_loads
    assert core.abort("second").finish_reason is FinishReason.ABORT
    assert [s for s, _ in core.scheduler.importing] == [first] and second.status is SequenceStatus.FINISHED
    while "busy" in core.seqs:
        core.step()
    core.poll_loads()  # "busy" freed its blocks: the import starts
    assert core.runner.started == [KvLoad("first", (4, 5), 8, Source(tuple(range(8))))]
    assert not core.scheduler.importing and [e.load.req_id for e in core.scheduler.loading.values()] == ["first"]


def test_an_import_whose_source_fails_to_start_fails_its_request_alone():
    core = make_core()
    core.runner.start_load = lambda load: (_ for _ in ()).throw(InvalidRequestError("gone"))
    core.add(importing("bad", 12, 8))
    assert [(o.req_id, o.finish_reason, o.error) for o in core.failed_loads] == [
        ("bad", FinishReason.ERROR, "KV load failed: gone")
    ]
    assert "bad" not in core.seqs and not core.scheduler.importing and core.block_manager.num_free_blocks == 16


def test_stats_count_what_ran():
    core = make_core()
    core.add(request("a", range(8), max_tokens=2))
    core.add(request("b", range(8), max_tokens=2))  # the same two full blocks... all but one token cached
    while core.has_work:
        core.step()
    s = core.stats()
    assert (s.num_waiting, s.num_running, s.num_generated_tokens) == (0, 0, 4)
    assert (s.prefix_queries, s.num_blocks_total, s.block_size) == (16, 16, BS)


# -- one owner of the queues -------------------------------------------------------------------
QUEUES = {"waiting", "running", "loading", "parked", "importing"}
MUTATORS = {
    "append",
    "appendleft",
    "extend",
    "extendleft",
    "insert",
    "pop",
    "popleft",
    "remove",
    "clear",
    "setdefault",
    "update",
    "rotate",
    "__setitem__",
    "__delitem__",
}


def _is_queue(node: ast.AST, aliases: set[str]) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value
    return (isinstance(node, ast.Attribute) and node.attr in QUEUES) or (
        isinstance(node, ast.Name) and node.id in aliases
    )


def queue_writes(tree: ast.AST) -> list[int]:
    """Lines that assign, delete, or call a mutating method on an attribute named like a scheduler queue, an item
    of one, or a local name bound to one (`waiting = self.scheduler.waiting`)."""
    aliases = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_queue(node.value, set())
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    lines = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = [t for t in node.targets if not isinstance(t, ast.Name)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        lines += [node.lineno for target in targets if _is_queue(target, aliases)]
    return sorted(lines)


def test_the_scan_sees_each_kind_of_queue_write():
    src = (
        "s.waiting.append(x)\ns.running = []\ns.loading[k] = v\ndel s.parked[k]\ns.waiting.remove(x)\n"
        "n = len(s.waiting)\nfor x in s.running: pass\nother.append(x)\nw = core.scheduler.waiting\nw.pop()\n"
        "s.importing.popleft()\n"
    )
    assert queue_writes(ast.parse(src)) == [1, 2, 3, 4, 5, 10, 11]


def test_only_the_scheduler_writes_its_queues():
    found = {}
    for folder in ("engines", "services", "tandem", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "engines/core/scheduler.py":
                continue
            lines = queue_writes(ast.parse(path.read_text(), str(path)))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_tiering_plug_in_holds_no_reference_to_the_core_or_the_scheduler():
    tree = ast.parse((ROOT / "engines/core/tiers/tiering.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    args = {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
    assert "engines.core.engine_core" not in imported and not {"core", "scheduler"} & args
