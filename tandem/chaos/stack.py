"""The stack a chaos scenario runs against: `tandem up`'s processes (sim engine) with their supervisor polling in a
thread, a faulty proxy in front of the workers a shape names, and what the scenarios ask of it: signals to one
process, the router's view of the workers, the gateway's metrics, the stack's memory.

Processes and sockets only; what a fault means for a scenario is scenarios.py's.
"""

import asyncio
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.common.grpc_server import make_channel
from services.common.protos import router_pb2, router_pb2_grpc
from tandem.chaos.proxy import ProxyProcess
from tandem.launcher import Stack, StackConfig, free_ports
from tandem.supervisor import CrashLoopError, Supervisor

SIM_TIME_FACTOR = 8.0  # simulated H100 steps stretched 8x: streams long enough to be cut, tokens few enough for 2 cores


@dataclass(frozen=True, slots=True)
class Shape:
    """What a stack is made of; scenarios with equal shapes share one stack, one after another."""

    engine: str = "sim"
    num_prefill: int = 1
    num_decode: int = 3
    proxied: tuple[str, ...] = ("decode-2",)
    max_num_seqs: int = 256  # the sim engine's and the router's, alike
    max_inflight: int = 1024  # the gateway's limit (429 past it)
    busy_load_threshold: float = 2.0  # the router's (503 past it)
    drain_s: float = 5.0  # TANDEM_WORKER_DRAIN_S
    lease_ttl_s: float = 4.0
    disagg_min_tokens: int = 512
    max_model_len: int = 0  # the workers' context (0: the model's); bounds how long one fuzzed request runs
    num_routers: int = 1  # router replicas ("router", "router-1", ...)
    api_keys: tuple[str, ...] = ()  # the gateway's keys (none: one anonymous tenant, no per-key limits)
    max_inflight_per_key: int = 64
    max_prompt_chars: int = 1 << 19


class ChaosStack(Stack):
    """A Stack whose proxied workers advertise their proxy's port."""

    def __init__(self, cfg: StackConfig, advertised: dict[str, int]):
        super().__init__(cfg)
        self.advertised = advertised

    def _worker_args(self, name: str) -> list[str]:
        extra = ["--advertise-port", str(self.advertised[name])] if name in self.advertised else []
        return [*super()._worker_args(name), *extra]


class LiveStack:
    def __init__(self, shape: Shape, model: str, log_dir: Path):
        self.shape, self.model, self.log_dir = shape, model, log_dir
        self.proxies: dict[str, ProxyProcess] = {}
        self.stack: ChaosStack | None = None
        self.restarts: list[tuple[float, str]] = []  # (time.monotonic(), child) of the supervisor's restarts
        self.failure: str = ""  # the supervisor gave up: why
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        ports = free_ports(len(self.shape.proxied) + 1)
        cfg = self._config(ports.pop())
        advertised = dict(zip(self.shape.proxied, ports))
        self.stack = ChaosStack(cfg, advertised)
        for name, port in advertised.items():
            self.proxies[name] = ProxyProcess("127.0.0.1", self.stack.worker_ports[name], port=port)
            self.proxies[name].start()
        self.stack.start()
        await asyncio.to_thread(self.stack.wait_ready)
        self._thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)
        self._thread.start()

    def _config(self, port: int) -> StackConfig:
        s = self.shape
        profile = self._profile()
        return StackConfig(
            model=self.model,
            num_prefill=s.num_prefill,
            num_decode=s.num_decode,
            num_routers=s.num_routers,
            port=port,
            engine=s.engine,
            num_threads=1,
            log_dir=self.log_dir,
            ready_timeout_s=180,
            worker_args=(
                "--sim-profile",
                str(profile),
                "--sim-time-factor",
                str(SIM_TIME_FACTOR),
                "--max-num-seqs",
                str(s.max_num_seqs),
                "--max-model-len",
                str(s.max_model_len),
            ),
            router_args=(
                "--policy",
                "kv",
                "--lease-ttl-s",
                str(s.lease_ttl_s),
                "--heartbeat-interval-s",
                "1",
                "--busy-load-threshold",
                str(s.busy_load_threshold),
                "--disagg-min-tokens",
                str(s.disagg_min_tokens),
            ),
            gateway_args=("--max-inflight", str(s.max_inflight), *self._tenancy_args()),
            env={"TANDEM_WORKER_DRAIN_S": str(s.drain_s), "TANDEM_LOG_LEVEL": "warning"},
        )

    def _tenancy_args(self) -> tuple[str, ...]:
        s = self.shape
        if not s.api_keys:
            return ()
        return (
            "--api-keys",
            ",".join(s.api_keys),
            "--max-inflight-per-key",
            str(s.max_inflight_per_key),
            "--max-prompt-chars",
            str(s.max_prompt_chars),
        )

    def _profile(self) -> Path:
        """The shipped H100 profile with this shape's batch limit, so the engine and the router agree on it."""
        from engines.timing.profile import DEFAULT_PROFILE, PROFILE_DIR

        profile = json.loads((PROFILE_DIR / f"{DEFAULT_PROFILE}.json").read_text())
        path = self.log_dir / f"sim-profile-{self.shape.max_num_seqs}.json"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**profile, "max_num_seqs": self.shape.max_num_seqs}))
        return path

    def _supervise(self) -> None:
        supervisor = Supervisor(
            lambda: [c.name for c in self.stack.children],
            self.stack.exit_code,
            self._restart,
            lambda name: self.stack.child(name).log_path.read_text()[-2000:],
        )
        while not self._stopping.wait(0.1):
            try:
                supervisor.poll()
            except CrashLoopError as exc:
                self.failure = str(exc)
                return

    def _restart(self, name: str) -> None:
        self.stack.restart(name)
        self.restarts.append((time.monotonic(), name))

    async def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self.stack is not None:
            await asyncio.to_thread(self.stack.stop)
        for proxy in self.proxies.values():
            await asyncio.to_thread(proxy.stop)

    # -- what scenarios do to it ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.stack.url

    def pid(self, name: str) -> int:
        return self.stack.child(name).proc.pid

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.pid(name), sig)

    async def terminate(self, name: str) -> tuple[int, float]:
        """SIGTERM one child; its exit code and how long it took to exit (it drains first)."""
        proc, started = self.stack.child(name).proc, time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait)
        return code, time.monotonic() - started

    async def workers(self) -> list[router_pb2.WorkerStatus]:
        async with make_channel(f"127.0.0.1:{self.stack.router_port}") as channel:
            reply = await router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=3)
        return list(reply.workers)

    async def is_ready(self) -> bool:
        """Every worker registered, none quarantined or holding a request, and the gateway idle."""
        try:
            listed = await self.workers()
            in_flight = await self.gateway_metric("tandem_gateway_requests_in_flight")
        except Exception:  # noqa: BLE001 - a restarting router or gateway: not ready yet
            return False
        expected = self.shape.num_prefill + self.shape.num_decode
        return (
            len(listed) == expected
            and in_flight == 0
            and all(w.quarantine_left_s == 0 and w.num_inflight == 0 and not w.load.num_running for w in listed)
        )

    async def wait_ready(self, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.is_ready():
                return True
            await asyncio.sleep(0.25)
        return False

    async def gateway_metric(self, name: str) -> float:
        """The sum of a gateway metric's series."""
        async with httpx.AsyncClient(timeout=5) as http:
            text = (await http.get(f"{self.url}/metrics")).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    async def router_metric(self, name: str) -> dict[str, float]:
        """A router metric's value per `worker_id` label."""
        async with httpx.AsyncClient(timeout=5) as http:
            text = (await http.get(self.stack.metrics_urls["router"])).text
        values = {}
        for line in text.splitlines():
            if line.startswith(name + "{") and 'worker_id="' in line:
                worker_id = line.split('worker_id="', 1)[1].split('"', 1)[0]
                values[worker_id] = float(line.rsplit(" ", 1)[1])
        return values

    async def worker_blocks(self, worker_id: str) -> float:
        """KV blocks `worker_id` holds by its own count: in use plus free ones still holding a reusable prefix."""
        async with httpx.AsyncClient(timeout=5) as http:
            text = (await http.get(self.stack.metrics_urls[worker_id])).text
        names = ("tandem_worker_kv_blocks_used", "tandem_worker_kv_blocks_cached_free")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(names))

    def rss_bytes(self) -> int:
        """Resident memory of every process the stack runs (engine processes included)."""
        return sum(_rss(pid) for pid in descendants(os.getpid()))


def descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
