"""The disaggregation check sees the prefill worker's real queue, live: 1 prefill and 2 decode sim workers, long
prompts at 3x the rate the heartbeat-era check could bear (prefill_max_waiting routes per heartbeat interval), the
prefill worker far from saturated. With the load stream, >= 90% are disaggregated; with heartbeats alone (the
stream off) the router guesses a queue from routes since the last heartbeat and sends many to decode workers."""

import asyncio
import random
import threading
import time

import httpx
import pytest

from tests.integration.conftest import running_stack, worker_stats, workers

HEARTBEAT_S, MAX_WAITING = 2.0, 4
RATE = 3 * MAX_WAITING / HEARTBEAT_S  # 6 long prompts a second
NUM_REQUESTS = 36  # 6 s of arrivals: three heartbeat intervals
PROMPT_TOKENS, MIN_TOKENS = 300, 256
MAX_TOKENS = 180  # each request stays in flight for a while after its prefill, as real answers do


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory):
    from tandem.models.init import init_model

    return init_model(tmp_path_factory.mktemp("sim-model"), "llama", tiny=True, config_only=True)


def decisions(stack) -> dict[str, float]:
    text = httpx.get(stack.metrics_urls["router"], timeout=5).text
    out = {}
    for line in text.splitlines():
        if line.startswith("tandem_router_decisions_total{") and 'outcome="' in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def send_at_rate(url: str, model: str) -> list[int]:
    rng = random.Random(0)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        await asyncio.sleep(i / RATE)
        prompt = [rng.randrange(3, 500) for _ in range(PROMPT_TOKENS)]  # distinct: nothing cached
        body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS}
        reply = await client.post(f"{url}/v1/completions", json=body)
        return reply.status_code

    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS)))


def max_prefill_waiting(stack, stop: threading.Event, seen: list[int]) -> None:
    address = next(w.worker.address for w in workers(stack) if w.worker.worker_id == "prefill-0")
    while not stop.is_set():
        seen.append(worker_stats(address).load.num_waiting)
        time.sleep(0.05)


def run_at_rate(model, tmp_path, stream_s: float) -> dict:
    """One stack, NUM_REQUESTS long prompts at RATE: the answers' statuses, the router's split, the prefill worker's
    peak waiting queue. bench/disagg_check_live.py keeps these figures; the test below judges them."""
    router_args = (
        "--heartbeat-interval-s",
        str(HEARTBEAT_S),
        "--prefill-max-waiting",
        str(MAX_WAITING),
        "--disagg-min-tokens",
        str(MIN_TOKENS),
        "--load-stream-interval-s",
        str(stream_s),
    )
    with running_stack(model, tmp_path, engine="sim", num_prefill=1, num_decode=2, router_args=router_args) as stack:
        stop, seen = threading.Event(), []
        watcher = threading.Thread(target=max_prefill_waiting, args=(stack, stop, seen), daemon=True)
        watcher.start()
        before = decisions(stack)
        statuses = asyncio.run(send_at_rate(f"http://127.0.0.1:{stack.cfg.port}", model.name))
        stop.set()
        watcher.join(timeout=5)
        after = decisions(stack)
    print(f"\n{stream_s=}: {after} (before {before}); prefill waiting max {max(seen)}")
    split = after.get("disaggregated", 0) - before.get("disaggregated", 0)
    total = split + after.get("aggregated", 0) - before.get("aggregated", 0)
    return {"statuses": statuses, "disaggregated": split, "routed": total, "prefill_peak_waiting": max(seen)}


@pytest.mark.parametrize("stream_s", [0.01, 0.0], ids=["load-stream", "heartbeats-only"])
def test_long_prompts_are_disaggregated_while_the_prefill_worker_has_room(sim_model, tmp_path, stream_s):
    run = run_at_rate(sim_model, tmp_path, stream_s)
    split, total, peak = run["disaggregated"], run["routed"], run["prefill_peak_waiting"]
    assert run["statuses"] == [200] * NUM_REQUESTS
    assert total == NUM_REQUESTS
    assert peak < MAX_WAITING, f"the prefill worker queued {peak}: saturated, the check may refuse it"
    if stream_s > 0:
        assert split / total >= 0.9, f"{split} of {total} disaggregated with the load stream"
    else:  # the old guess: every route since the last heartbeat counts as waiting
        assert split / total < 0.75, f"{split} of {total} disaggregated on heartbeats alone"
