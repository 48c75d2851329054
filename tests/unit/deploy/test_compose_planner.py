"""The planner in compose.yaml: its settings parse, the services its compose connector scales are the worker
services, the compose file it names is the one mounted, and it reaches the Docker socket, Prometheus and the
router by the names compose gives them."""
from services.planner.factory import make_connector
from services.planner.types import WorkerRole
from tests.unit.deploy.helpers import environment, load_compose
from tests.unit.deploy.test_compose import check_command

SERVICES = load_compose()["services"]
PLANNER = SERVICES["planner"]


def planner_settings(monkeypatch):
    return check_command(PLANNER["command"], environment(PLANNER), monkeypatch)


def test_the_planner_scales_the_worker_services_of_the_file_it_mounts(monkeypatch):
    settings = planner_settings(monkeypatch)
    assert settings.connector == "compose" and settings.source == "prometheus"
    assert f"./compose.yaml:{settings.compose_file}:ro" in PLANNER["volumes"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in PLANNER["volumes"]
    project = make_connector(settings).project
    for role in WorkerRole:
        service = SERVICES[project.services[role]]
        assert service["command"][:3] == ["tandem", "serve", role.value]
        assert "ports" not in service  # scalable
    argv = project.scale_argv(WorkerRole.DECODE, 3)
    assert argv == ["docker", "compose", "-f", "/opt/tandem/compose.yaml", "-p", "tandem", "up", "--detach",
                    "--no-deps", "--no-recreate", "--scale", "decode=3", "decode"]


def test_the_planner_reads_prometheus_and_the_router_by_their_compose_names(monkeypatch):
    settings = planner_settings(monkeypatch)
    assert settings.prometheus_url == "http://prometheus:9090" and "prometheus" in SERVICES
    assert settings.router_address == "router:50051"
    assert settings.metrics_port == 9464 and settings.port == 50071
    assert PLANNER["healthcheck"]["test"][-1] == f"127.0.0.1:{settings.port}"
    assert {"router", "prometheus"} <= set(PLANNER["depends_on"])
