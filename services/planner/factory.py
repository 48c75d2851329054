"""Builds the planner's connector and observation source from its settings. Wiring only."""

from services.planner.connectors.compose import ComposeConnector, ComposeProject, scaler_client
from services.planner.connectors.local import LocalConnector
from services.planner.settings import PlannerSettings
from services.planner.sources import PrometheusSource, RouterSource
from services.planner.types import WorkerRole


def make_connector(s: PlannerSettings):
    roles = {WorkerRole.DECODE: 0, **({WorkerRole.PREFILL: 0} if s.max_prefill else {})}
    if s.connector == "local":
        return LocalConnector(s.local_control_url)
    if s.connector == "compose":
        services = {WorkerRole.PREFILL: s.compose_prefill_service, WorkerRole.DECODE: s.compose_decode_service}
        project = ComposeProject(s.scaler_url, s.compose_project, services)
        return ComposeConnector(project, scaler_client(s.scaler_url, s.scaler_token_file))
    from services.planner.connectors.kubernetes import KubernetesConnector, KubernetesTarget, load_apis, own_namespace

    names = {WorkerRole.PREFILL: s.k8s_prefill_deployment, WorkerRole.DECODE: s.k8s_decode_deployment}
    target = KubernetesTarget(
        own_namespace(s.k8s_namespace),
        {r: names[r] for r in roles},
        s.k8s_gpus_per_replica,
        s.k8s_gpu_budget,
        s.k8s_manual_hold_s,
    )
    return KubernetesConnector(target, *load_apis(s.k8s_kubeconfig))


def make_source(s: PlannerSettings):
    if s.source == "prometheus":
        return PrometheusSource(s.prometheus_url, s.prometheus_range_s, s.slo, s.slo_quantile)
    return RouterSource(s.router_address)
