"""The gateway pipeline's CPU per request and per token against fake router and workers (issue 23 item 4: the
pipeline on domain types, RouterPool and WorkerClients holding the stubs), this tree against an anchor tree.

The fakes (tests/unit/services/gateway/fakes.py, this tree's) serve in one child process; each tree's Pipeline runs in
a child of its own (PYTHONPATH=tree) and counts its process CPU (every thread, gRPC's included) over N requests at a
concurrency, aggregated (Route, Generate, Complete) and disaggregated (Route, Prefill, Generate, Complete). Rounds
alternate which tree goes first. Prints a table, writes JSON. With `--in-process` there are no fakes and no sockets:
every channel is bench/gateway_seam_fake_channel.py's, so the figures are the pipeline's own Python (each round
keeps the least CPU of `--repeats` passes).
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
MODES = ("aggregated", "disaggregated")


async def _serve(num_tokens: int) -> None:
    """The fakes: a router per mode (one routes through the prefill worker), a worker answering every role."""
    from services.common.protos import router_pb2_grpc
    from tests.unit.services.gateway.fakes import FakeRouter, FakeWorker, add_worker, start_server

    worker = FakeWorker(list(range(100, 100 + num_tokens)))
    server, worker.address = await start_server(add_worker, worker)
    servers, routers = [server], {}
    for mode in MODES:
        router = FakeRouter()
        router.decode_address, router.model = worker.address, "m"
        router.prefill_address = worker.address if mode == "disaggregated" else None
        routers[mode] = router
        router_server, router.address = await start_server(router_pb2_grpc.add_RouterServicer_to_server, router)
        servers.append(router_server)  # NOTE: held: a server garbage-collected stops
    print(json.dumps({m: r.address for m, r in routers.items()}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    for one in servers:
        await one.stop(0)


async def _measure(address: str, args) -> dict[str, float]:
    """Pipeline CPU µs per request and per token over `num_requests` after a warm-up of `concurrency` requests; the
    least of `repeats` passes."""
    import grpc

    from engines.base.types import SamplingParams
    from services.gateway.pipeline import Pipeline

    if args.in_process:
        import gateway_seam_fake_channel  # beside this script: on sys.path as its folder

        gateway_seam_fake_channel.install(args.num_tokens, address == "disaggregated")
    num_requests, concurrency, num_tokens = args.num_requests, args.concurrency, args.num_tokens
    pipeline = Pipeline(grpc.aio.insecure_channel(address), model="m", request_timeout_s=30, route_timeout_s=10)
    params = SamplingParams(max_tokens=num_tokens)
    prompt = list(range(1, 129))
    counts = []

    async def one(i: int) -> None:
        n = 0
        async for delta in pipeline.generate(f"r{i}", prompt, params):
            n += len(delta.token_ids)
        counts.append(n)

    async def batch(first: int, n: int) -> None:
        sem = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> None:
            async with sem:
                await one(i)

        await asyncio.gather(*(gated(i) for i in range(first, first + n)))

    await batch(0, concurrency)
    best = None
    for _ in range(args.repeats):
        counts.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        await batch(concurrency, num_requests)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert sum(counts) == num_requests * num_tokens, sum(counts)
        best = min(best or (cpu, wall), (cpu, wall))
    await pipeline.close()
    cpu, wall = best
    per_token = cpu / (num_requests * num_tokens) * 1e6
    return {"cpu_us_per_request": cpu / num_requests * 1e6, "cpu_us_per_token": per_token, "wall_s": wall}


def _child(tree: str, address: str, args) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--measure", address]
    cmd += ["--num-requests", str(args.num_requests), "--concurrency", str(args.concurrency)]
    cmd += ["--num-tokens", str(args.num_tokens), "--repeats", str(args.repeats)]
    cmd += ["--in-process"] if args.in_process else []
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode:
        raise RuntimeError(f"the measuring child for {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rounds(trees: dict[str, str], addresses: dict[str, str], args) -> dict:
    runs = {mode: {label: [] for label in trees} for mode in MODES}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for mode in MODES:
            for label in order:
                runs[mode][label].append(_child(trees[label], addresses[mode], args))
    return runs


def _table(runs: dict) -> dict:
    summary = {}
    print(f"{'mode':14} {'tree':7} {'CPU µs/request (median)':>24} {'CPU µs/token':>13} {'per round':>40}")
    for mode, by_tree in runs.items():
        for label, rounds in by_tree.items():
            per_req = [x["cpu_us_per_request"] for x in rounds]
            med = statistics.median(per_req)
            tok = statistics.median(x["cpu_us_per_token"] for x in rounds)
            summary[f"{mode}/{label}"] = {"cpu_us_per_request": round(med, 1), "cpu_us_per_token": round(tok, 2)}
            print(f"{mode:14} {label:7} {med:24.1f} {tok:13.2f} {', '.join(f'{v:.0f}' for v in per_req):>40}")
        if "anchor" in by_tree:
            ratio = summary[f"{mode}/this"]["cpu_us_per_request"] / summary[f"{mode}/anchor"]["cpu_us_per_request"]
            summary[f"{mode}/ratio"] = round(ratio, 3)
            print(f"{mode:14} ratio this/anchor: {ratio:.3f}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--anchor", help="a checkout of the tree to compare against (its tandem/v1 stubs built)")
    ap.add_argument("--num-requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="passes per round; a round keeps its cheapest")
    ap.add_argument("--in-process", action="store_true", help="fake channels in the measuring process: no sockets")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return asyncio.run(_serve(args.num_tokens))
    if args.measure:
        print(json.dumps(asyncio.run(_measure(args.measure, args))))
        return None
    trees = {"anchor": args.anchor, "this": str(HERE)} if args.anchor else {"this": str(HERE)}
    if args.in_process:
        return _report(_rounds(trees, {mode: mode for mode in MODES}, args), args)
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    cmd = [sys.executable, __file__, "--serve", "--num-tokens", str(args.num_tokens)]
    server = subprocess.Popen(cmd, env=env, cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        runs = _rounds(trees, json.loads(server.stdout.readline()), args)
    finally:
        server.stdin.close()
        server.wait(10)
    return _report(runs, args)


def _report(runs: dict, args) -> None:
    summary = _table(runs)
    if args.json:
        keys = ("num_requests", "concurrency", "num_tokens", "rounds", "repeats", "in_process")
        doc = {"args": {k: getattr(args, k) for k in keys}, "summary": summary, "runs": runs}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
