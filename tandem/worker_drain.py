"""`tandem worker drain`: what a worker pod's preStop hook runs. It sends SIGTERM to the worker's server process (in
its container, PID 1), which deregisters from the router before it finishes what it holds, and returns once the
router no longer lists the worker: from then on no request is routed to the terminating pod. It waits for nothing
else; the worker's own drain (TANDEM_WORKER_DRAIN_S) goes on after it returns."""

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable

POLL_S = 0.2


def add_worker_commands(commands) -> None:
    worker = commands.add_parser("worker", help="act on a running worker (a container's preStop hook)")
    actions = worker.add_subparsers(dest="worker_command", required=True)
    drain = actions.add_parser("drain", help="make the router stop choosing this worker, which then drains")
    drain.add_argument("--pid", type=int, default=1, help="the worker's server process (default 1: the container's)")
    from services.common.worker_settings import SOURCE as WORKER  # NOTE: the worker's own fields, not copies

    worker_id, router = WORKER.setting("worker_id"), WORKER.setting("router_address")
    drain.add_argument(
        "--worker-id", default=WORKER.read("worker_id"), help=f"as registered with the router (env {worker_id.env})"
    )
    drain.add_argument("--router-address", default=WORKER.read("router_address"), help=f"(env {router.env})")
    drain.add_argument("--timeout-s", type=float, default=10.0, help="most seconds to wait for the router")
    drain.set_defaults(func=_run_drain)


def wait_deregistered(
    worker_id: str,
    listed: Callable[[], set[str]],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """True once `listed()` (the router's worker ids) lacks `worker_id`; False when `timeout_s` passes first.
    A router that cannot be asked confirms nothing: it is asked again until the time is up."""
    deadline = clock() + timeout_s
    while True:
        try:
            if worker_id not in listed():
                return True
        except OSError:
            pass
        if clock() >= deadline:
            return False
        sleep(POLL_S)


def router_worker_ids(router_address: str, timeout_s: float = 2.0) -> Callable[[], set[str]]:
    """The worker ids the router lists now; an unreachable router raises ConnectionError."""
    import grpc

    from services.common.grpc_server import make_sync_channel
    from services.common.protos import router_pb2, router_pb2_grpc

    def listed() -> set[str]:
        try:
            with make_sync_channel(router_address) as channel:
                reply = router_pb2_grpc.RouterStub(channel).ListWorkers(
                    router_pb2.ListWorkersRequest(), timeout=timeout_s
                )
        except grpc.RpcError as exc:
            raise ConnectionError(f"router {router_address}: {exc.code().name}") from None
        return {w.worker.worker_id for w in reply.workers}

    return listed


def _run_drain(args: argparse.Namespace) -> int:
    if not args.worker_id:
        from services.common.worker_settings import SOURCE as WORKER

        print(
            f"tandem worker drain: error: the worker's id is required (--worker-id or "
            f"{WORKER.setting('worker_id').env})",
            file=sys.stderr,
        )
        return 2
    try:
        os.kill(args.pid, signal.SIGTERM)
    except OSError as exc:  # gone already, or not ours to signal
        print(f"tandem worker drain: error: cannot signal process {args.pid}: {exc.strerror}", file=sys.stderr)
        return 1
    if not wait_deregistered(args.worker_id, router_worker_ids(args.router_address), args.timeout_s):
        print(
            f"tandem worker drain: {args.worker_id} is still listed by the router at {args.router_address} "
            f"after {args.timeout_s:.0f} s",
            file=sys.stderr,
        )
        return 1
    print(f"tandem worker drain: {args.worker_id} deregistered; it finishes what it holds and exits", flush=True)
    return 0
