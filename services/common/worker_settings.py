"""WorkerSettings: one frozen object per prefill/decode worker, from TANDEM_WORKER_* and flags, composed of the
engine sub-configs it hands whole to a backend (each of their fields keeps its flat variable and flag)."""

import argparse
import ipaddress
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from engines.base.engine_configs import BatchConfig, CacheConfig, TransferConfig
from engines.native.config import SpeculativeOptions
from engines.sim.config import SimOptions
from engines.transfer import transports
from engines.transfer.nixl_link import NixlSettings
from engines.trtllm.config import TRTLLM_BACKENDS, TRTLLM_KV_DTYPES, TRTLLM_TRANSCEIVERS, TrtllmOptions
from services.common.kv_signing import parse_key
from services.common.roles import WorkerRole
from services.common.settings import SettingsError, env
from services.common.settings_loader import Source

ENGINES = ("native", "zero", "sim", "trtllm")
OVERLAP = ("auto", "on", "off")  # auto: on for CUDA devices, where a step runs asynchronously to the host
KV_TRANSPORTS = transports.SETTINGS  # auto: nixl when it imports
KEY_ENV = "TANDEM_KV_SIGNING_KEY_FILE"
INSECURE_ENV = "TANDEM_GRPC_INSECURE"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    role: WorkerRole
    model: str
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    advertise_host: str = ""  # what the router hands out; default host
    worker_id: str = ""  # default: <role>-<hostname>-<port>
    router_address: str = "127.0.0.1:50051"
    engine: str = "native"
    dtype: str = "float32"
    device: str = "cpu"
    num_threads: int = 0  # 0: torch's default
    cache: CacheConfig = CacheConfig()  # block_size, num_blocks (0: sized from memory), the card's share, the tiers
    batch: BatchConfig = BatchConfig()  # max_num_seqs, max_num_batched_tokens, max_model_len, prefix caching
    # kv_transport (TANDEM_KV_TRANSPORT): how a decode engine reads a prefill engine's KV; the held-KV TTL is the
    # lease's (transfer_config)
    transfer: TransferConfig = TransferConfig()
    kv_lease_s: float = 30.0  # prefill role: how long blocks wait to be pulled
    drain_s: float = 30.0  # at SIGTERM: how long running requests may take to finish before they are handed back
    advertise_port: int = 0  # what the router hands out; 0: the port it listens on (another: a proxy in front)
    metrics_port: int = -1  # Prometheus /metrics over HTTP; -1: none, 0: any free port
    # engine sim's own knobs, each read as sim_<field>: its profile, time factor and real KV cache
    sim: SimOptions = SimOptions()
    trtllm: TrtllmOptions = TrtllmOptions()  # engine trtllm's own knobs, each read as trtllm_<field>
    overlap: str = "auto"  # the engine loop sends step N-1's outputs while step N runs on the device
    kv_staging_mb: int = 256  # the gRPC fallback's shared-memory staging buffer: its bound on KV in flight
    kv_signing_key_file: str = ""  # TANDEM_KV_SIGNING_KEY_FILE: the deployment's shared key (hex) for KV handles
    # TANDEM_KV_HASH_SECRET: keys every block hash's root; gateway, router and workers must share it (repr: hidden)
    kv_hash_secret: str = field(default="", repr=False)
    # engine native's own knobs: speculative decoding, each field read under its own name (speculative, ...)
    speculation: SpeculativeOptions = SpeculativeOptions()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "role", WorkerRole(self.role))  # NOTE: "decode" reads as WorkerRole.DECODE
        except ValueError:
            raise SettingsError(f"role must be one of {[r.value for r in WorkerRole]}, got {self.role!r}") from None
        if not self.model:
            raise SettingsError("a model directory is required (--model or TANDEM_MODEL)")
        if self.overlap not in OVERLAP:
            raise SettingsError(f"overlap must be one of {OVERLAP}, got {self.overlap!r}")
        if self.engine not in ENGINES:
            raise SettingsError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.transfer.kv_transport not in KV_TRANSPORTS:
            raise SettingsError(f"kv_transport must be one of {KV_TRANSPORTS}, got {self.transfer.kv_transport!r}")
        try:  # NOTE: the engine process reads it; checked here so a bad value stops the worker before it starts
            NixlSettings.from_env()
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if self.kv_staging_mb < 1:
            raise SettingsError(f"kv_staging_mb must be >= 1, got {self.kv_staging_mb}")
        if self.kv_lease_s <= 0:
            raise SettingsError("kv_lease_s must be > 0")
        if self.drain_s < 0:
            raise SettingsError(f"drain_s must be >= 0, got {self.drain_s}")
        if not 0 < self.cache.gpu_memory_utilization <= 1:
            raise SettingsError(f"gpu_memory_utilization must be in (0, 1], got {self.cache.gpu_memory_utilization}")
        if self.engine == "trtllm" and (self.cache.kv_host_gb or self.cache.kv_disk_gb):
            raise SettingsError(
                "engine trtllm keeps its own KV tiers: set kv_cache_config.host_cache_size in "
                "--trtllm-options instead of --kv-host-gb / --kv-disk-gb"
            )
        self._check_kv_key()
        self._check_speculative()

    def _check_kv_key(self) -> None:
        """A key that reads; no key only on loopback or in the explicit plaintext mode (handles go unsigned)."""
        if self.kv_signing_key_file:
            self.kv_signing_key()
        elif not _is_loopback(self.host) and not env(INSECURE_ENV, False):
            raise SettingsError(
                f"no KV signing key: set {KEY_ENV} (a file of >= 32 random bytes in hex, e.g. "
                f"`tandem certs init`) or, for plaintext development only, {INSECURE_ENV}=1"
            )

    def kv_signing_key(self) -> bytes | None:
        """The deployment's KV signing key; None without one (unsigned handles, plaintext dev mode)."""
        if not self.kv_signing_key_file:
            return None
        try:
            return parse_key(Path(self.kv_signing_key_file).read_text())
        except (OSError, ValueError) as exc:
            raise SettingsError(f"{KEY_ENV}={self.kv_signing_key_file!r}: {exc}") from None

    def _check_speculative(self) -> None:
        if self.speculation.method and self.engine != "native":
            raise SettingsError(f"speculative decoding runs in the native engine, not in engine {self.engine!r}")

    def transfer_config(self, held_kv_grace_s: float) -> TransferConfig:
        """The transport as asked ("auto" resolved by the engine factory); blocks held a grace past the lease."""
        return replace(self.transfer, held_kv_ttl_s=self.kv_lease_s + held_kv_grace_s)

    @property
    def is_overlapped(self) -> bool:
        return self.overlap == "on" or (self.overlap == "auto" and self.device.startswith("cuda"))

    def resolved_worker_id(self, port: int) -> str:
        return self.worker_id or f"{self.role.value}-{socket.gethostname()}-{port}"

    def advertised_address(self, port: int) -> str:
        """Where the router sends others: advertise_host, else host — or, when listening on every
        interface (a container), this machine's address as its hostname resolves."""
        host = self.advertise_host or self.host
        if host in ("0.0.0.0", "::", ""):
            host = _own_address()
        return f"{host}:{self.advertise_port or port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _own_address() -> str:
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


_HELP = {
    "model": "local checkpoint directory",
    "host": "the address the gRPC server binds (0.0.0.0 to serve other hosts)",
    "router_address": "where to register",
    "dtype": "float32, bfloat16 or float16",
    "device": "cpu, or cuda",
    "block_size": "tokens per KV block",
    "max_num_seqs": "running requests per step",
    "max_num_batched_tokens": "per-step token budget (chunked prefill)",
    "enable_prefix_caching": "the prefix cache",
    "trtllm_tensor_parallel_size": "engine trtllm: GPUs per worker",
    "engine": f"one of {ENGINES}",
    "overlap": f"one of {OVERLAP}: send step N-1's outputs while step N runs (auto: on for CUDA)",
    "gpu_memory_utilization": "GPU engines: share of the card's memory this worker may use, weights included",
    "trtllm_backend": f"engine trtllm: one of {TRTLLM_BACKENDS} (auto: tensorrt for an engine directory)",
    "trtllm_quant": "engine trtllm: fp8 or nvfp4 weights (pytorch backend: a ModelOpt checkpoint of them)",
    "trtllm_kv_cache_dtype": f"engine trtllm: one of {TRTLLM_KV_DTYPES}",
    "trtllm_cache_transceiver": f"engine trtllm: how KV moves between workers, one of {TRTLLM_TRANSCEIVERS}",
    "trtllm_options": "engine trtllm: a JSON file of further tensorrt_llm.LLM(...) arguments",
    "kv_host_gb": "host memory for KV blocks evicted from the device pool (>= the device KV to help); 0: none",
    "kv_disk_dir": "directory for KV blocks seen twice, kept across restarts (needs --kv-disk-gb)",
    "kv_disk_gb": "disk for KV blocks below the host tier (>= --kv-host-gb to help)",
    "kv_transport": f"one of {KV_TRANSPORTS} (env TANDEM_KV_TRANSPORT): NIXL READs, gRPC into staging memory, or bytes through the engine's pipe",
    "kv_staging_mb": "the gRPC KV fallback's shared-memory buffer (MiB): KV pulled or exported at once",
    "sim_profile": 'engine sim: a shipped profile name or a profile JSON path; "": the default',
    "sim_time_factor": "engine sim: multiplies every modelled step time (0: as fast as possible)",
    "sim_kv_cache_mb": "engine sim: hold a real paged KV cache of this many MiB (0: timing only)",
    "sim_kv_bytes_per_token": "engine sim: KV bytes per token (Llama-3.1-8B in bf16)",
    "kv_signing_key_file": f"the deployment's KV signing key, hex (env {KEY_ENV}); required off loopback",
    "kv_hash_secret": "keys the KV block hashes (prefer env TANDEM_KV_HASH_SECRET); the same on every service",
    "num_speculative_tokens": "engine native: the most tokens proposed per request and step",
    "speculative": "engine native: speculative decoding, 'ngram' (prompt lookup) or 'draft:DIR' (a small model with "
    "the target's tokenizer); '' (default): off",
}
SOURCE = Source(
    WorkerSettings,
    "TANDEM_WORKER_",
    env={
        "model": "TANDEM_MODEL",
        "kv_transport": "TANDEM_KV_TRANSPORT",
        "kv_signing_key_file": KEY_ENV,
        "kv_hash_secret": "TANDEM_KV_HASH_SECRET",
    },
    help=_HELP,
    fixed=("role",),
    negated=("enable_prefix_caching",),
    prefixed={"trtllm": "trtllm_", "sim": "sim_"},
    # native's CPU share; chunked prefill (always on in a worker); the lease's TTL (transfer_config)
    # and speculative decoding's verify costs (measured at start)
    kept=("kv_cache_memory_fraction", "enable_chunked_prefill", "held_kv_ttl_s", "spec_verify_costs"),
)


def parse_worker_settings(role: WorkerRole, argv: list[str] | None) -> WorkerSettings:
    """The settings from TANDEM_WORKER_* and flags; raises SettingsError for a bad or missing value."""
    role = WorkerRole(role)
    parser = argparse.ArgumentParser(prog=f"tandem serve {role.value}")
    SOURCE.add_arguments(parser)
    return SOURCE.load(parser.parse_args(argv), role=role)
