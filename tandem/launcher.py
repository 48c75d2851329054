"""`tandem up`'s Stack: router, prefill and decode workers and the gateway as separate local processes. It starts
them, waits until they are ready, starts one again on request (tandem/supervisor.py decides when) and stops every
process it started (children also die with it if it is killed outright). stack_run.py drives it."""

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.identity import Identity
from services.common.process import PARENT_PID_ENV
from tandem.stack_certs import KV_KEY_ENV, TLS_ENV, StackPki, is_insecure
from tandem.supervisor import Supervisor

PROMETHEUS_CONFIG = Path(__file__).resolve().parents[1] / "observability" / "prometheus" / "prometheus-local.yml"


@dataclass(frozen=True, slots=True)
class StackConfig:
    model: str
    num_prefill: int = 1
    num_decode: int = 1
    port: int = 8000
    host: str = "127.0.0.1"
    engine: str = "native"
    router_port: int = 0  # 0: a free port (the first router's; further replicas always get free ports)
    num_routers: int = 1  # router replicas: "router", "router-1", ...; every worker registers with each
    dtype: str = "float32"
    num_threads: int = 0  # per worker; 0: the cores divided among workers
    log_dir: Path = Path(".cache/logs")
    ready_timeout_s: float = 300.0
    worker_args: tuple[str, ...] = ()
    router_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    prometheus_port: int = -1  # > 0: also run Prometheus on it (scraping every service), when installed
    num_gateway_workers: int | None = None  # gateway processes on its port; None: TANDEM_GATEWAY_WORKERS, else 1
    planner: bool = False  # also run the planner, scaling these workers through the launcher (tandem/stack_control.py)
    planner_args: tuple[str, ...] = ()
    kv_disk_dir: str = ""  # each worker's disk KV tier goes in its own subdirectory (its name: kept across restarts)


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    command: list[str] = field(default_factory=list)


class Stack:
    def __init__(self, cfg: StackConfig):
        # NOTE: one secret per stack keys every KV block hash, so a guessed prompt cannot be confirmed from the events
        secret = cfg.env.get(KV_HASH_SECRET_ENV) or os.environ.get(KV_HASH_SECRET_ENV) or kv_hash_secret(cfg.log_dir)
        self.cfg = dataclasses.replace(cfg, env={**cfg.env, KV_HASH_SECRET_ENV: secret})
        self.children: list[Child] = []
        workers = [f"prefill-{i}" for i in range(cfg.num_prefill)] + [f"decode-{i}" for i in range(cfg.num_decode)]
        # NOTE: every port a child listens on is chosen here, all at once and distinct, and no child binds port 0:
        # a child's "any free port" could otherwise take a port chosen for another one before that one binds it
        # router gRPC and metrics, per worker gRPC and metrics; never the ports the caller chose (picked earlier,
        # and already released, so the kernel may offer them again)
        if cfg.num_routers < 1:
            raise ValueError(f"need at least one router, got {cfg.num_routers}")
        routers = ["router"] + [f"router-{i}" for i in range(1, cfg.num_routers)]
        ports = iter(free_ports(2 * len(routers) + 2 * len(workers), exclude={cfg.port, cfg.router_port}))
        self.router_port = cfg.router_port or next(ports)
        self.router_ports = {"router": self.router_port, **{name: next(ports) for name in routers[1:]}}
        self.worker_ports = {name: next(ports) for name in workers}  # gRPC
        self.metrics_ports: dict[str, int] = {name: next(ports) for name in [*routers, *workers]}
        self.metrics_ports["gateway"] = cfg.port  # the gateway serves /metrics on its API port
        self.retired: list[Child] = []  # workers the planner removed: draining, then gone
        self.control = None  # the planner's control endpoint, with cfg.planner
        self.pki: StackPki | None = None  # certificates and KV key, made at start (tandem/stack_certs.py)

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.port}"

    @property
    def is_mutual_tls(self) -> bool:
        return not is_insecure(self.cfg.env)

    def start(self) -> None:
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        self.pki = StackPki(self.cfg.log_dir.parent / "pki")
        if self.is_mutual_tls:
            self.pki.activate()  # NOTE: from here on this process (and what it starts) dials as the operator
        router = ",".join(f"127.0.0.1:{port}" for port in self.router_ports.values())  # every replica
        for name, port in self.router_ports.items():
            self._spawn(name, ["router", "--port", str(port), *self._metrics_args(name), *self.cfg.router_args])
        threads = str(
            self.cfg.num_threads or max(1, (os.cpu_count() or 1) // max(1, self.cfg.num_prefill + self.cfg.num_decode))
        )
        common = [
            "--model",
            self.cfg.model,
            "--router-address",
            router,
            "--engine",
            self.cfg.engine,
            "--dtype",
            self.cfg.dtype,
            "--num-threads",
            threads,
            *self.cfg.worker_args,
        ]
        for i in range(self.cfg.num_prefill):
            self._spawn(f"prefill-{i}", ["prefill", *common, *self._worker_args(f"prefill-{i}")])
        for i in range(self.cfg.num_decode):
            self._spawn(f"decode-{i}", ["decode", *common, *self._worker_args(f"decode-{i}")])
        self._spawn(
            "gateway",
            [
                "gateway",
                "--model-dir",
                self.cfg.model,
                "--router-address",
                router,
                "--served-model-name",
                served_name(self.cfg.model),
                "--host",
                self.cfg.host,
                "--port",
                str(self.cfg.port),
                *self._gateway_workers_args(),
                *self.cfg.gateway_args,
            ],
        )
        self.write_targets()

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {name: f"http://127.0.0.1:{port}/metrics" for name, port in self.metrics_ports.items()}

    @property
    def targets_path(self) -> Path:
        return self.cfg.log_dir / "prometheus-targets.json"

    def write_targets(self) -> Path:
        """Every service's metrics endpoint as a Prometheus file_sd file (written whole, then renamed)."""
        groups = [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"service": name.split("-")[0], "instance_name": name}}
            for name, port in self.metrics_ports.items()
        ]
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=2) + "\n")
        tmp.replace(self.targets_path)
        return self.targets_path

    def start_prometheus(self) -> str | None:
        """Prometheus on the file_sd file, as a child like the services; None (and why, printed) when the
        binary is not installed."""
        binary = shutil.which("prometheus")
        if binary is None:
            print(
                "prometheus is not installed (Debian: apt-get install prometheus); metrics are still served "
                "at the endpoints below",
                flush=True,
            )
            return None
        config = self.cfg.log_dir / "prometheus.yml"  # next to the targets file it names by a relative path
        shutil.copyfile(PROMETHEUS_CONFIG, config)
        data = self.cfg.log_dir.parent / "prometheus-data"
        port = self.cfg.prometheus_port
        self._spawn_command(
            "prometheus",
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
        )
        return f"http://127.0.0.1:{port}"

    def _gateway_workers_args(self) -> list[str]:
        return [] if self.cfg.num_gateway_workers is None else ["--workers", str(self.cfg.num_gateway_workers)]

    def _metrics_args(self, name: str) -> list[str]:
        return ["--metrics-port", str(self.metrics_ports[name])]

    def _worker_args(self, name: str) -> list[str]:
        disk = ["--kv-disk-dir", str(Path(self.cfg.kv_disk_dir) / name)] if self.cfg.kv_disk_dir else []
        return ["--worker-id", name, "--port", str(self.worker_ports[name]), *self._metrics_args(name), *disk]

    def wait_ready(self) -> None:
        """Until the gateway says ready and every worker has registered; a child that exits is started again,
        one that will not stay up raises CrashLoopError."""
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        expected = self.cfg.num_prefill + self.cfg.num_decode
        supervisor = self.supervisor()
        while time.monotonic() < deadline:
            supervisor.poll()
            if self._registered() >= expected and self._gateway_ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"stack not ready after {self.cfg.ready_timeout_s:.0f}s; logs in {self.cfg.log_dir}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM in reverse start order (gateway first, router last), then SIGKILL stragglers."""
        if self.control is not None:
            self.control.close()
        children = [*self.retired, *self.children]
        for child in reversed(children):
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in reversed(children):
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        if self.pki is not None:
            self.pki.deactivate()

    def _spawn(self, name: str, args: list[str]) -> None:
        self._spawn_command(name, [sys.executable, "-m", "tandem.cli", "serve", *args])

    def _spawn_command(self, name: str, command: list[str]) -> None:
        if command[0] != sys.executable:  # not Python: arm the signal in a tiny Python shim that execs it
            command = [sys.executable, "-c", _EXEC_SHIM, *command]
        log_path = self.cfg.log_dir / f"{name}.log"
        self.children.append(Child(name, self._popen(name, command, log_path, "w"), log_path, command))

    def _security_env(self, name: str) -> dict[str, str]:
        """The child's own certificate and the stack's KV signing key (a key the caller names wins); plaintext (no TLS
        variables) when insecure."""
        if self.pki is None:
            return {}
        env = (
            {**dict.fromkeys(TLS_ENV, ""), KV_KEY_ENV: str(self.pki.kv_key)}
            if not self.is_mutual_tls
            else self.pki.child_env(name)
        )
        if os.environ.get(KV_KEY_ENV) or KV_KEY_ENV in self.cfg.env:  # NOTE: "" in cfg.env: unsigned (a baseline)
            env.pop(KV_KEY_ENV, None)
        return env

    def _popen(self, name: str, command: list[str], log_path: Path, mode: str) -> subprocess.Popen:
        """A child in its own session (a terminal's Ctrl-C reaches the launcher, which stops them in order) that
        dies with the launcher. NOTE: no preexec_fn: forking a process whose gRPC threads are busy (tests, the
        readiness probe) can abort the child before exec; the child arms its own death signal instead."""
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **self.cfg.env,
            **self._security_env(name),
            PARENT_PID_ENV: str(os.getpid()),
        }
        with open(log_path, mode) as log_file:
            return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def channel(self, address: str, identity: Identity | None = None):
        """A blocking channel to one of this stack's services, as `identity` (default: this process's own, the
        operator under mTLS)."""
        from services.common.grpc_server import make_sync_channel

        tls = self.pki.tls_of(identity) if identity is not None and self.is_mutual_tls else None
        return make_sync_channel(address, tls)

    def child(self, name: str) -> Child | None:
        return next((c for c in self.children if c.name == name), None)

    def exit_code(self, name: str) -> int | None:
        """The child's exit code; None while it runs, or once the planner has retired it."""
        child = self.child(name)
        return child.proc.poll() if child is not None else None

    def restart(self, name: str) -> None:
        """Start a child that exited again, with the same command, ports and id; its log goes on."""
        child = self.child(name)
        if child is None:
            return
        with open(child.log_path, "a") as log_file:
            log_file.write(f"\n--- restarted by tandem up after {child.proc.returncode} ---\n")
        child.proc = self._popen(name, child.command, child.log_path, "a")

    def supervisor(self) -> Supervisor:
        # NOTE: a copy of the names each round: the planner's control thread may add or retire workers meanwhile
        return Supervisor(
            lambda: [c.name for c in list(self.children)],
            self.exit_code,
            self.restart,
            lambda name: self.child(name).log_path.read_text()[-2000:],
        )

    def _gateway_ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _registered(self) -> int:
        import grpc

        from services.common.grpc_server import make_sync_channel
        from services.common.protos import router_pb2, router_pb2_grpc  # (generated on first import)

        counts = []  # NOTE: the stack is ready once every replica sees every worker: the fewest any replica has
        for port in self.router_ports.values():
            try:
                with make_sync_channel(f"127.0.0.1:{port}") as channel:
                    reply = router_pb2_grpc.RouterStub(channel).ListWorkers(router_pb2.ListWorkersRequest(), timeout=1)
                    counts.append(len(reply.workers))
            except grpc.RpcError:
                counts.append(0)
        return min(counts)


def served_name(model: str) -> str:
    """The name clients use: the model directory's, without the `org--` of the model cache."""
    return Path(model).name.split("--")[-1]


def free_port() -> int:
    return free_ports(1)[0]


def kv_hash_secret(log_dir: Path) -> str:
    """This stack's KV hash secret, kept 0600 beside its logs so a restarted stack finds its disk-tier blocks."""
    path = log_dir.parent / "kv-hash.secret"
    if path.is_file():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(16))
    return path.read_text().strip()


def free_ports(n: int, exclude: set[int] = frozenset()) -> list[int]:
    """`n` distinct ports free now and not in `exclude` (each held until all are picked, so none repeats)."""
    sockets, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in exclude:
                ports.append(s.getsockname()[1])
        return ports
    finally:
        for s in sockets:
            s.close()


KV_HASH_SECRET_ENV = "TANDEM_KV_HASH_SECRET"  # the block hashes' key: the same for every child of one stack
_EXEC_SHIM = (
    "import os, sys; from services.common.process import die_with_parent; die_with_parent(); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
