"""The planner's settings: one frozen object from TANDEM_PLANNER_* variables, overridden by CLI flags.

A bad value raises SettingsError at start-up, naming the setting.
"""

import argparse
from dataclasses import dataclass

from engines.timing.profile import DEFAULT_PROFILE
from services.common.settings import SettingsError
from services.common.settings_loader import Source
from services.planner.calibration import CalibrationConfig
from services.planner.feedback import FeedbackConfig, FeedbackError
from services.planner.perf_model import Sizing, Slo
from services.planner.predictors import PREDICTORS
from services.planner.prefill_queue import PrefillQueueConfig
from services.planner.state_machine import PlannerConfig, RoleBounds
from services.planner.types import PlannerConfigError

ENV_PREFIX = "TANDEM_PLANNER_"
SOURCES = ("router", "prometheus")
LIVE_CONNECTORS = ("local", "compose", "kubernetes")  # "virtual" belongs to `tandem sim --planner`


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    host: str = "0.0.0.0"
    port: int = 50071  # gRPC (GetPlan); 0 = any free port
    metrics_port: int = -1  # Prometheus /metrics over HTTP; -1: none, 0: any free port
    source: str = "router"  # observed load: the router's and workers' own figures, or "prometheus"
    router_address: str = "127.0.0.1:50051"  # every router replica: a comma list or dns:NAME:PORT (each is read)
    prometheus_url: str = "http://127.0.0.1:9090"
    prometheus_range_s: float = 30.0  # rates and quantiles over this much of the past (>= 2 scrape intervals)
    connector: str = "local"
    profile: str = DEFAULT_PROFILE  # the workers' timing profile: a shipped name or a JSON path
    slo_ttft_s: float = 0.5
    slo_itl_s: float = 0.05
    slo_quantile: float = 0.95  # observed TTFT and ITL are compared to the SLO at this quantile
    adjustment_interval_s: float = 60.0
    tick_s: float = 5.0  # the fast correction loop
    predictor: str = "constant"  # the best of the three on the Azure trace (bench/RESULTS.md, "Planner")
    predictor_window: int = 3
    season_length: int = 0
    min_prefill: int = 1
    max_prefill: int = 8  # 0: no prefill pool (aggregated serving)
    min_decode: int = 1
    max_decode: int = 8
    up_ticks: int = 2
    down_ticks: int = 6
    down_stabilization: int = 2
    max_correction: int = 4
    itl_headroom: float = 0.8
    prefill_max_utilization: float = 0.8
    # headroom from the observed SLO error (services/planner/feedback.py); up gain 0 and down factor 1: off
    feedback_up_gain: float = FeedbackConfig().up_gain
    feedback_down_factor: float = FeedbackConfig().down_factor
    feedback_max_factor: float = FeedbackConfig().max_factor
    # the SLA judged as the share of a window's feasible requests that missed it (services/planner/slo_misses.py)
    miss_budget: float = FeedbackConfig().budget
    miss_window_ticks: int = PlannerConfig().miss_window_ticks
    miss_deviations: float = PlannerConfig().miss_deviations
    # the model's speed from the workers' busy-time counters (services/planner/calibration.py); 0: trust the model
    calibration_weight: float = CalibrationConfig().weight
    # up at once on a climb: the last CLIMB_TICKS ticks' arrivals at >= CLIMB_RATIO x the predicted rate; 0: off
    climb_ticks: int = PlannerConfig().climb_ticks
    climb_ratio: float = PlannerConfig().climb_ratio
    climb_deviations: float = PlannerConfig().climb_deviations
    burst_headroom: float = PlannerConfig().burst_headroom
    burst_memory: int = PlannerConfig().burst_memory
    decode_burst_headroom: float = PlannerConfig().decode_burst_headroom
    rise_lead: float = PlannerConfig().rise_lead
    # prefill sized by the TTFT tail of the recent prompts (services/planner/prefill_queue.py); 0: the utilization cap
    prefill_miss_share: float = PrefillQueueConfig().miss_share
    connector_retries: int = 3  # attempts per scaling call before the tick gives up (the next tick tries again)
    connector_backoff_s: float = 1.0
    local_control_url: str = ""  # connector local: `tandem up`'s control endpoint
    scaler_url: str = ""  # connector compose: the scaler service that alone runs docker, e.g. http://scaler:8081
    scaler_token_file: str = ""  # the scaler's bearer token (its volume, mounted read-only)
    compose_project: str = ""
    compose_prefill_service: str = "prefill"
    compose_decode_service: str = "decode"
    k8s_namespace: str = ""  # "": the pod's own namespace (in-cluster), else "default"
    k8s_prefill_deployment: str = "tandem-prefill"
    k8s_decode_deployment: str = "tandem-decode"
    k8s_gpus_per_replica: int = 1
    k8s_gpu_budget: int = 0  # most GPUs the worker Deployments may hold together; 0: no budget
    k8s_kubeconfig: str = ""  # "": in-cluster configuration, else the default kubeconfig
    k8s_manual_hold_s: float = 300.0  # a count changed by hand is left alone this long

    def __post_init__(self) -> None:
        _one_of("source", self.source, SOURCES)
        _one_of("predictor", self.predictor, PREDICTORS)
        if self.connector == "virtual":
            raise SettingsError("connector virtual is the simulator's: use `tandem sim --planner sla`")
        _one_of("connector", self.connector, LIVE_CONNECTORS)
        if self.connector == "compose" and not (self.scaler_url and self.scaler_token_file and self.compose_project):
            raise SettingsError(
                "connector compose needs the scaler: TANDEM_PLANNER_SCALER_URL, "
                "TANDEM_PLANNER_SCALER_TOKEN_FILE and TANDEM_PLANNER_COMPOSE_PROJECT"
            )
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "slo_ttft_s",
            "slo_itl_s",
            "adjustment_interval_s",
            "tick_s",
            "connector_backoff_s",
            "prometheus_range_s",
            "k8s_manual_hold_s",
        ):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("slo_quantile", "itl_headroom", "prefill_max_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise SettingsError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not 1 <= self.min_decode <= self.max_decode:
            raise SettingsError(f"need 1 <= min_decode <= max_decode, got {self.min_decode} and {self.max_decode}")
        if self.max_prefill and not 1 <= self.min_prefill <= self.max_prefill:
            raise SettingsError(
                f"need 1 <= min_prefill <= max_prefill (or max_prefill 0), got "
                f"{self.min_prefill} and {self.max_prefill}"
            )
        for name in (
            "up_ticks",
            "down_ticks",
            "down_stabilization",
            "predictor_window",
            "connector_retries",
            "k8s_gpus_per_replica",
        ):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_correction < 0 or self.season_length < 0 or self.k8s_gpu_budget < 0:
            raise SettingsError("max_correction, season_length and k8s_gpu_budget must be >= 0")
        if not 0 < self.miss_budget < 1:
            raise SettingsError(f"miss_budget must be in (0, 1), got {self.miss_budget}")
        try:
            _ = self.planner_config  # NOTE: built here only to check it
        except FeedbackError as exc:
            raise SettingsError(f"feedback_*: {exc}") from None
        except PlannerConfigError as exc:
            raise SettingsError(str(exc)) from None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def slo(self) -> Slo:
        return Slo(self.slo_ttft_s, self.slo_itl_s)

    @property
    def sizing(self) -> Sizing:
        return Sizing(self.itl_headroom, self.prefill_max_utilization)

    @property
    def feedback(self) -> FeedbackConfig:
        return FeedbackConfig(
            budget=self.miss_budget,
            up_gain=self.feedback_up_gain,
            down_factor=self.feedback_down_factor,
            max_factor=self.feedback_max_factor,
        )

    @property
    def calibration(self) -> CalibrationConfig:
        if not 0 <= self.calibration_weight <= 1:
            raise PlannerConfigError(f"calibration_weight must be in [0, 1], got {self.calibration_weight}")
        weight = self.calibration_weight or CalibrationConfig().weight  # NOTE: 0 turns it off; the weight is then moot
        return CalibrationConfig(is_enabled=self.calibration_weight > 0, weight=weight)

    @property
    def planner_config(self) -> PlannerConfig:
        return PlannerConfig(
            adjustment_interval_s=self.adjustment_interval_s,
            prefill=RoleBounds(self.min_prefill if self.max_prefill else 0, self.max_prefill),
            decode=RoleBounds(self.min_decode, self.max_decode),
            up_ticks=self.up_ticks,
            down_ticks=self.down_ticks,
            max_correction=self.max_correction,
            down_stabilization=self.down_stabilization,
            predictor=self.predictor,
            predictor_window=self.predictor_window,
            season_length=self.season_length,
            feedback=self.feedback,
            calibration=self.calibration,
            miss_window_ticks=self.miss_window_ticks,
            miss_deviations=self.miss_deviations,
            climb_ticks=self.climb_ticks,
            climb_ratio=self.climb_ratio,
            climb_deviations=self.climb_deviations,
            burst_headroom=self.burst_headroom,
            burst_memory=self.burst_memory,
            decode_burst_headroom=self.decode_burst_headroom,
            rise_lead=self.rise_lead,
            prefill_queue=PrefillQueueConfig(self.prefill_miss_share),
        )

    @classmethod
    def from_env(cls) -> "PlannerSettings":
        return SOURCE.load()


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


SOURCE = Source(
    PlannerSettings,
    ENV_PREFIX,
    help={
        "host": "the address the gRPC server binds",
        "prometheus_url": "source prometheus: where it is",
        "connector": "local (`tandem up`'s processes), compose (through the scaler) or kubernetes (the worker "
        "Deployments' scale subresource)",
        "slo_ttft_s": "the TTFT SLO the fleet is sized for",
        "slo_itl_s": "the ITL SLO the fleet is sized for",
        "adjustment_interval_s": "the prediction loop",
        "predictor_window": "predictor moving_average: its window",
        "season_length": "predictor holt_winters: intervals per season (0: none)",
        "min_prefill": "bounds per role",
        "min_decode": "bounds per role",
        "max_decode": "bounds per role",
        "up_ticks": "hysteresis of the fast loop",
        "down_ticks": "hysteresis of the fast loop",
        "down_stabilization": "hysteresis of shrinking",
        "max_correction": "replicas the fast loop may add at once",
        "itl_headroom": "how close to the ITL SLO the perf model sizes decode",
        "prefill_max_utilization": "how busy the perf model lets prefill workers be",
        "feedback_down_factor": "headroom from the observed SLO error (services/planner/feedback.py)",
        "feedback_max_factor": "headroom from the observed SLO error (services/planner/feedback.py)",
        "miss_budget": "the share of requests the fast loop lets miss their SLO before it adds a replica",
        "miss_window_ticks": "the fast loop judges the missed share over this many ticks",
        "miss_deviations": "the fast loop adds a replica only when the misses exceed the budget by this many "
        "binomial standard deviations (0: the share alone)",
        "calibration_weight": "how far one interval's measured speed moves the model's (0: off, 1: the newest alone)",
        "climb_ticks": "a climb is judged on this many ticks' arrivals",
        "climb_ratio": "a climb: those arrivals at >= this x the predicted rate (0: off)",
        "climb_deviations": "a climb: and this many standard deviations over it, the arrivals' measured dispersion "
        "counted (0: the ratio alone)",
        "burst_headroom": "size for this many times the predicted rate, so a burst is carried while replicas start",
        "burst_memory": "the headroom from the largest burst over the base in this many intervals, burst_headroom "
        "its cap (0: burst_headroom always)",
        "decode_burst_headroom": "the decode pool's burst headroom, at most burst_headroom (0: burst_headroom)",
        "rise_lead": "the base rate's last rise carried this many intervals ahead, never a fall (0: off)",
        "prefill_miss_share": "prefill workers: the fewest whose replay of the recent prompts queues at most this "
        "share past the TTFT SLO (0: the utilization cap alone)",
        "connector_backoff_s": "the first retry's backoff (doubling)",
        "compose_project": "connector compose: the project the scaler scales",
        "compose_prefill_service": "connector compose: the prefill service",
        "compose_decode_service": "connector compose: the decode service",
        "k8s_prefill_deployment": "connector kubernetes: the prefill Deployment",
        "k8s_decode_deployment": "connector kubernetes: the decode Deployment",
        "k8s_gpus_per_replica": "connector kubernetes: GPUs each worker replica holds",
    },
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (--slo-ttft-s, ...); an absent flag keeps the environment's value."""
    SOURCE.add_arguments(parser)


def settings_from(args: argparse.Namespace) -> PlannerSettings:
    return SOURCE.load(args)
