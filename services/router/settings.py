"""The router's settings: one frozen object from TANDEM_ROUTER_* variables, overridden by CLI flags.

A bad value raises SettingsError at start-up, naming the setting.
"""

import argparse
import dataclasses
from dataclasses import dataclass

from services.common.settings import SettingsError
from services.common.settings_loader import Source
from services.router.core import BusyThresholds
from services.router.kv_policy import KvPolicyConfig
from services.router.policy import POLICIES

ENV_PREFIX = "TANDEM_ROUTER_"


@dataclass(frozen=True, slots=True)
class RouterSettings:
    host: str = "0.0.0.0"
    port: int = 50051  # 0 = any free port (tests)
    policy: str = "least_loaded"
    lease_ttl_s: float = 10.0  # a worker silent this long leaves the pool
    heartbeat_interval_s: float = 2.0  # told to workers when they register
    disagg_min_tokens: int = 512  # uncached prompt tokens below which the decode worker prefills locally
    prefill_max_waiting: int = 4  # a prefill worker with this many waiting counts as saturated
    inflight_ttl_s: float = 600.0  # a routed request never completed stops counting as load after this
    sweep_interval_s: float = 1.0  # how often lapsed leases and stale in-flight entries are removed
    kv_overlap_weight: float = 1.0  # policy kv: blocks of prefill saved per cached block
    kv_inflight_weight: float = 0.1  # policy kv: what a block held by an in-flight request costs (1: Dynamo's)
    kv_temperature: float = 0.0  # policy kv: 0 = argmin, > 0 = softmax draw over costs
    kv_use_events: bool = True  # policy kv: subscribe to workers' KV events (False: own decisions only)
    kv_predict_ttl_s: float = 120.0  # policy kv: how long the router trusts its own decisions
    kv_index_max_entries: int = 1_000_000  # policy kv: block hashes the prefix index holds
    # policy kv: what a block in a worker's host / disk KV tier counts for, in [0, 1]; < 0: what it saves against
    # recomputing there, from the bandwidth and prefill rate the worker reports (before it reports: 0.75 / 0.25)
    kv_host_weight: float = -1.0
    kv_disk_weight: float = -1.0
    metrics_port: int = -1  # Prometheus /metrics over HTTP; -1: none, 0: any free port
    quarantine_s: float = 5.0  # a worker a gateway reports failed is avoided this long (Dynamo: 5 s)
    startup_grace_s: float = 3.0  # after a (re)start, a Route that finds no worker waits this long for them to register
    probe_timeout_s: float = 2.0  # a lapsed lease: how long the health probe may take before eviction
    max_lease_extensions: int = 3  # leases a probe may grant in a row before a silent worker is evicted anyway
    busy_load_threshold: float = 2.0  # shed load (503) when every decode worker has this many sequences per slot
    # prefill workers' load streamed as it changes (StreamLoad), checked this often; 0: heartbeats only
    load_stream_interval_s: float = 0.01
    busy_kv_threshold: float = 0.0  # ... or this share of its KV blocks in use (0: off, as the load one)
    # TANDEM_KV_HASH_SECRET: keys the block hashes' roots, as gateway and workers do (repr: hidden)
    kv_hash_secret: str = dataclasses.field(default="", repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        if self.policy not in POLICIES:
            raise SettingsError(f"policy must be one of {', '.join(sorted(POLICIES))}, got {self.policy!r}")
        for name in ("lease_ttl_s", "heartbeat_interval_s", "inflight_ttl_s", "sweep_interval_s"):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_interval_s >= self.lease_ttl_s:
            raise SettingsError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be below "
                f"lease_ttl_s ({self.lease_ttl_s}), or every lease lapses between heartbeats"
            )
        if self.disagg_min_tokens < 0 or self.prefill_max_waiting < 1:
            raise SettingsError(
                f"need disagg_min_tokens >= 0 and prefill_max_waiting >= 1, got "
                f"{self.disagg_min_tokens} and {self.prefill_max_waiting}"
            )

        if self.kv_overlap_weight < 0 or self.kv_inflight_weight < 0 or self.kv_temperature < 0:
            raise SettingsError(
                f"need kv_overlap_weight, kv_inflight_weight and kv_temperature >= 0, got "
                f"{self.kv_overlap_weight}, {self.kv_inflight_weight} and {self.kv_temperature}"
            )
        if self.kv_host_weight > 1 or self.kv_disk_weight > 1:
            raise SettingsError(
                f"kv_host_weight and kv_disk_weight must be <= 1 (< 0: derived), got "
                f"{self.kv_host_weight} and {self.kv_disk_weight}"
            )
        if self.quarantine_s < 0 or not self.probe_timeout_s > 0 or self.max_lease_extensions < 0:
            raise SettingsError(
                f"need quarantine_s >= 0, probe_timeout_s > 0 and max_lease_extensions >= 0, got "
                f"{self.quarantine_s}, {self.probe_timeout_s} and {self.max_lease_extensions}"
            )
        if self.startup_grace_s < 0 or self.load_stream_interval_s < 0:
            raise SettingsError(
                f"startup_grace_s and load_stream_interval_s must be >= 0, got "
                f"{self.startup_grace_s} and {self.load_stream_interval_s}"
            )
        if self.busy_load_threshold < 0 or not 0 <= self.busy_kv_threshold <= 1:
            raise SettingsError(
                f"need busy_load_threshold >= 0 and busy_kv_threshold in [0, 1], got "
                f"{self.busy_load_threshold} and {self.busy_kv_threshold}"
            )
        if not self.kv_predict_ttl_s > 0 or self.kv_index_max_entries < 1:
            raise SettingsError(
                f"need kv_predict_ttl_s > 0 and kv_index_max_entries >= 1, got "
                f"{self.kv_predict_ttl_s} and {self.kv_index_max_entries}"
            )

    @property
    def kv_config(self) -> KvPolicyConfig:
        return KvPolicyConfig(
            overlap_weight=self.kv_overlap_weight,
            inflight_weight=self.kv_inflight_weight,
            temperature=self.kv_temperature,
            use_events=self.kv_use_events,
            predict_ttl_s=self.kv_predict_ttl_s,
            host_weight=self.kv_host_weight if self.kv_host_weight >= 0 else None,
            disk_weight=self.kv_disk_weight if self.kv_disk_weight >= 0 else None,
        )

    @property
    def busy(self) -> BusyThresholds:
        return BusyThresholds(load=self.busy_load_threshold, kv=self.busy_kv_threshold)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_env(cls) -> "RouterSettings":
        return SOURCE.load()


SOURCE = Source(
    RouterSettings,
    ENV_PREFIX,
    env={"kv_hash_secret": "TANDEM_KV_HASH_SECRET"},
    help={
        "host": "the address the gRPC server binds",
        "port": "gRPC port (0: any free port)",
        "policy": f"one of {', '.join(sorted(POLICIES))} (kv: KV-aware)",
        "kv_disk_weight": "policy kv: what a block in a worker's disk tier counts for, as kv_host_weight",
    },
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (--lease-ttl-s, ...); an absent flag keeps the environment's value."""
    SOURCE.add_arguments(parser)


def settings_from(args: argparse.Namespace) -> RouterSettings:
    return SOURCE.load(args)
