"""The planner and the scaler in compose.yaml: their settings parse, the planner reaches Docker only through the
scaler (which alone mounts the socket and allows only the worker services), both read the same token volume, and
the scaler's own compose reads the file it mounts."""

from services.planner.types import WorkerRole
from tests.unit.deploy.helpers import environment, load_compose
from tests.unit.deploy.test_compose import check_command

SERVICES = load_compose()["services"]
PLANNER, SCALER = SERVICES["planner"], SERVICES["scaler"]
SOCKET = "/var/run/docker.sock"


def planner_settings(monkeypatch):
    return check_command(PLANNER["command"], environment(PLANNER), monkeypatch)


def scaler_settings(monkeypatch):
    return check_command(SCALER["command"], environment(SCALER), monkeypatch)


def test_only_the_scaler_mounts_the_docker_socket():
    holders = [name for name, s in SERVICES.items() for v in s.get("volumes", []) if v.startswith(SOCKET + ":")]
    assert sorted(holders) == ["alloy", "scaler"]
    assert any(v == f"{SOCKET}:{SOCKET}:ro" for v in SERVICES["alloy"]["volumes"])  # reads logs only
    assert "group_add" not in PLANNER and "ports" not in SCALER


def test_the_planner_scales_the_worker_services_through_the_scaler(monkeypatch):
    planner, scaler = planner_settings(monkeypatch), scaler_settings(monkeypatch)
    assert planner.connector == "compose" and planner.source == "prometheus"
    assert planner.scaler_url == f"http://scaler:{scaler.port}" and scaler.host == "0.0.0.0"
    assert planner.compose_project == scaler.project == "tandem"
    assert PLANNER["depends_on"]["scaler"]["condition"] == "service_healthy"
    allowed = scaler.policy.allowed
    for role in WorkerRole:
        service = getattr(planner, f"compose_{role.value}_service")
        assert service in allowed and SERVICES[service]["command"][:3] == ["tandem", "serve", role.value]
        assert "ports" not in SERVICES[service]  # scalable
    workers = {
        n for n, s in SERVICES.items() if s.get("command", [])[1:3] in (["serve", "prefill"], ["serve", "decode"])
    }
    assert set(allowed) == workers  # nothing else: not the gateway, the router, Grafana ...
    assert allowed["decode"].min_replicas >= 1


def test_both_read_the_token_volume_only_the_scaler_writes_it(monkeypatch):
    planner, scaler = planner_settings(monkeypatch), scaler_settings(monkeypatch)
    directory = scaler.token_file.rsplit("/", 1)[0]
    assert planner.scaler_token_file == scaler.token_file
    assert f"scaler-token:{directory}" in SCALER["volumes"] and f"scaler-token:{directory}:ro" in PLANNER["volumes"]
    assert sum("scaler-token:" in v for s in SERVICES.values() for v in s.get("volumes", [])) == 2
    assert f"./compose.yaml:{scaler.compose_file}:ro" in SCALER["volumes"]
    assert SCALER["healthcheck"]["test"][-1] == f"http://127.0.0.1:{scaler.port}/health"


def test_the_scalers_compose_sees_the_variables_the_workers_read():
    import re

    import yaml

    from tests.unit.deploy.helpers import COMPOSE_FILE

    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    worker_vars = set(re.findall(r"\$\{(\w+)", yaml.safe_dump(raw["services"]["decode"])))
    worker_vars |= set(re.findall(r"\$\{(\w+)", yaml.safe_dump(raw["x-worker-env"])))
    worker_vars -= {"TANDEM_BASE_IMAGE", "TANDEM_TORCH_WHEELS", "TANDEM_TORCH_INDEX"}  # build args: images exist
    assert worker_vars <= set(raw["services"]["scaler"]["environment"]), worker_vars
    assert "GRAFANA_ADMIN_PASSWORD" in raw["services"]["scaler"]["environment"]  # required by the whole file


def test_the_planner_reads_prometheus_and_the_router_by_their_compose_names(monkeypatch):
    settings = planner_settings(monkeypatch)
    assert settings.prometheus_url == "http://prometheus:9090" and "prometheus" in SERVICES
    assert settings.router_address == "router:50051"
    assert settings.metrics_port == 9464 and settings.port == 50071
    assert PLANNER["healthcheck"]["test"][-1] == f"127.0.0.1:{settings.port}"
    assert {"router", "prometheus"} <= set(PLANNER["depends_on"])
