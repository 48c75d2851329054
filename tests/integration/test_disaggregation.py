"""Disaggregated serving against aggregated serving, live: the same greedy prompts give the same tokens
whether the prompt's KV was computed on a prefill worker and shipped, or computed on the decode worker; each
handoff ships exactly the prompt's blocks and leaves nothing held on the prefill worker."""

import json
import random
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engines.transfer.nixl_link import is_available
from tests.integration.conftest import all_worker_stats, running_stack
from tests.integration.helpers import poll

MAX_TOKENS = 16
LOGPROB_ATOL = 1e-5  # float32 on CPU: a prefill chunk and a decode step may order the sums differently
SETTLE_S = 5.0


def _token_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(length)]  # the tiny vocabulary, special ids left out


PENALTIES = {
    "presence_penalty": 0.5,
    "frequency_penalty": 1.5,
    "repetition_penalty": 1.3,
    "logit_bias": {"7": 2.0},
    "ignore_eos": True,
}
# name -> request body (without "model"); token-id prompts straddle the 16-token block boundaries
CASES: dict[str, dict] = {
    **{
        f"tokens-{n}": {"prompt": _token_prompt(n, seed=n), "max_tokens": MAX_TOKENS, "logprobs": 2}
        for n in (1, 15, 16, 17, 47, 130)
    },
    "text": {"prompt": "the cat sat on the mat and then", "max_tokens": MAX_TOKENS, "logprobs": 2},
    "chat": {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "one-token": {"prompt": _token_prompt(20, seed=99), "max_tokens": 1, "logprobs": 2},
    # the prefill worker samples the first token under the penalties (repetition sees the prompt), the decode
    # worker the rest (presence/frequency see the first token as generated): the same as one worker does
    "tokens-47-penalized": {"prompt": _token_prompt(47, seed=47), "max_tokens": MAX_TOKENS, "logprobs": 2, **PENALTIES},
}


@dataclass(frozen=True)
class Run:
    """One request and what each worker's counters did across it (after settling)."""

    body: dict
    before: dict
    after: dict

    def delta(self, worker_id: str, field: str) -> int:
        return getattr(self.after[worker_id], field) - getattr(self.before[worker_id], field)


class Cases(dict):
    """name -> Run, and the KV transport the stack ran with."""

    def __init__(self, transport: str, runs: dict[str, Run]):
        super().__init__(runs)
        self.transport = transport


def _is_prefill_idle(stats: dict) -> bool:
    prefill = stats.get("prefill-0")
    return prefill is None or (prefill.load.num_held == 0 and prefill.load.num_blocks_used == 0)


def run_cases(model: Path, tmp_path: Path, num_prefill: int, transport: str = "grpc") -> dict[str, Run]:
    """Start a stack, send every case in turn (greedy), stop the stack; one stack at a time on this machine."""
    runs = {}
    env = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1", "TANDEM_KV_TRANSPORT": transport}
    with (
        running_stack(model, tmp_path, num_prefill=num_prefill, num_decode=1, env=env) as stack,
        httpx.Client(timeout=60) as http,
    ):
        for name, case in CASES.items():
            route = "/v1/chat/completions" if "messages" in case else "/v1/completions"
            before = all_worker_stats(stack)
            response = http.post(stack.url + route, json={"model": model.name, "temperature": 0, **case})
            assert response.status_code == 200, (name, response.text)
            after = poll(lambda: all_worker_stats(stack), _is_prefill_idle, SETTLE_S)
            runs[name] = Run(response.json(), before, after)
    return runs


@pytest.fixture(scope="module", params=["nixl", "grpc", "bytes"])
def disaggregated(request, tiny_stack_model, tmp_path_factory) -> dict[str, Run]:
    """Over each KvConnector a CPU has: the decode engine READs the prefill engine's blocks (NIXL), PullKv streams
    them through staging memory (grpc), or as a KvExport the decode engine writes (bytes)."""
    if request.param == "nixl" and not is_available():
        pytest.skip("NIXL is not installed")
    return Cases(
        request.param,
        run_cases(tiny_stack_model, tmp_path_factory.mktemp("disagg"), num_prefill=1, transport=request.param),
    )


@pytest.fixture(scope="module")
def aggregated(tiny_stack_model, tmp_path_factory, disaggregated) -> dict[str, Run]:
    return run_cases(tiny_stack_model, tmp_path_factory.mktemp("agg"), num_prefill=0)


def _tokens_and_logprobs(body: dict) -> tuple[list, list[float]]:
    """The generated tokens (with their top alternatives) and the chosen tokens' logprobs."""
    lp = body["choices"][0]["logprobs"]
    if "content" in lp:  # chat
        tokens = [(e["token"], e["bytes"], [t["token"] for t in e["top_logprobs"]]) for e in lp["content"]]
        return tokens, [e["logprob"] for e in lp["content"]]
    return list(zip(lp["tokens"], [list(t) for t in lp["top_logprobs"]])), lp["token_logprobs"]


def _answer(body: dict) -> tuple:
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return text, choice["finish_reason"], body["usage"]


def _kv_bytes(model_dir: Path, num_tokens: int, block_size: int) -> int:
    """float32 KV of the blocks holding `num_tokens`: [layers, 2, blocks, block_size, kv_heads, head_dim]."""
    cfg = json.loads((model_dir / "config.json").read_text())
    num_blocks = -(-num_tokens // block_size)
    return cfg["num_hidden_layers"] * 2 * num_blocks * block_size * cfg["num_key_value_heads"] * cfg["head_dim"] * 4


@pytest.mark.parametrize("name", sorted(CASES))
def test_disaggregated_output_equals_aggregated(disaggregated, aggregated, name):
    split, local = disaggregated[name].body, aggregated[name].body
    assert _answer(split) == _answer(local)
    split_tokens, split_logprobs = _tokens_and_logprobs(split)
    local_tokens, local_logprobs = _tokens_and_logprobs(local)
    assert split_tokens == local_tokens
    assert split_logprobs == pytest.approx(local_logprobs, abs=LOGPROB_ATOL)
    assert len(split_tokens) == split["usage"]["completion_tokens"]


def test_penalties_change_the_answer_in_both_modes(disaggregated, aggregated):
    for runs in (disaggregated, aggregated):
        plain, penalized = (
            _tokens_and_logprobs(runs["tokens-47"].body),
            _tokens_and_logprobs(runs["tokens-47-penalized"].body),
        )
        assert plain[0] != penalized[0]


def test_cases_run_to_their_length(disaggregated):
    # a comparison of two empty answers would prove nothing: each case generated tokens until max_tokens
    for name, run in disaggregated.items():
        assert run.body["usage"]["completion_tokens"] == CASES[name]["max_tokens"], name
        assert run.body["choices"][0]["finish_reason"] == "length", name


# NOTE: the penalized case repeats tokens-47's prompt, so its prefill finds those blocks cached
@pytest.mark.parametrize("name", sorted(set(CASES) - {"one-token", "tokens-47-penalized"}))
def test_each_handoff_ships_the_prompts_blocks_once(disaggregated, tiny_stack_model, name):
    run = disaggregated[name]
    num_prompt = run.body["usage"]["prompt_tokens"]
    expected = _kv_bytes(tiny_stack_model, num_prompt, run.after["prefill-0"].block_size)
    assert run.delta("decode-0", "kv_bytes_imported") == expected
    # a NIXL READ is the decode worker's alone: the prefill worker serves no bytes itself
    assert run.delta("prefill-0", "kv_bytes_exported") == (0 if disaggregated.transport == "nixl" else expected)
    # the prefill worker computed the prompt and sampled the first token; the decode worker only the rest
    assert run.delta("prefill-0", "num_prompt_tokens_computed") == num_prompt
    assert run.delta("prefill-0", "num_generated_tokens") == 1
    assert run.delta("decode-0", "num_prompt_tokens_computed") == 0  # only the first token's KV: an output token
    assert run.delta("decode-0", "num_generated_tokens") == MAX_TOKENS - 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_prefill_worker_holds_nothing_after_each_request(disaggregated, name):
    load = disaggregated[name].after["prefill-0"].load
    assert (load.num_held, load.num_blocks_used, load.num_running, load.num_waiting) == (0, 0, 0, 0), (
        f"prefill worker still busy {SETTLE_S:.0f}s after {name}: {load}"
    )


def test_one_token_request_ends_on_the_prefill_worker(disaggregated):
    run = disaggregated["one-token"]
    assert run.delta("prefill-0", "num_generated_tokens") == 1
    assert run.delta("prefill-0", "kv_bytes_exported") == 0
    assert run.delta("decode-0", "kv_bytes_imported") == 0
    assert run.delta("decode-0", "num_generated_tokens") == 0


def test_aggregated_stack_imports_nothing(aggregated):
    for name, run in aggregated.items():
        assert list(run.after) == ["decode-0"], name
        assert run.delta("decode-0", "kv_bytes_imported") == 0, name
        assert run.delta("decode-0", "num_generated_tokens") == CASES[name]["max_tokens"], name
