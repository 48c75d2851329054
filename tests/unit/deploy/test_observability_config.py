"""The observability configs: dashboards use only catalogued metrics in plain PromQL, Grafana's provisioning
points at datasources and dashboards that exist, Prometheus finds every tandem service compose starts."""

import importlib.util
import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.unit.deploy.helpers import COMPOSE_FILE, OBSERVABILITY, REPO, environment, load_compose

DASHBOARD_DIR = OBSERVABILITY / "grafana" / "dashboards"
PROVISIONING = OBSERVABILITY / "grafana" / "provisioning"
SERVICES = load_compose()["services"]


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _exprs() -> list[tuple[str, str, str]]:
    return [
        (name, panel["title"], target["expr"])
        for name, d in _dashboards().items()
        for panel in _panels(d)
        for target in panel.get("targets", [])
    ]


def _catalog() -> set[str]:
    """Metric names in observability/README.md's tables."""
    text = (OBSERVABILITY / "README.md").read_text()
    return set(re.findall(r"^\| `(tandem_\w+)` \|", text, flags=re.M))


def _datasources() -> list[dict]:
    return [
        ds
        for path in sorted((PROVISIONING / "datasources").glob("*.yaml"))
        for ds in yaml.safe_load(path.read_text())["datasources"]
    ]


def _concrete(expr: str) -> str:
    """As a dashboard-checking test runs it: $__rate_interval -> 1m, every other variable -> .*"""
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr.replace("$__rate_interval", "1m"))


def test_the_four_dashboards_exist_and_parse():
    dashboards = _dashboards()
    assert set(dashboards) == {"overview", "workers", "router", "planner"}
    assert len({d["uid"] for d in dashboards.values()}) == 4
    assert len(_exprs()) >= 20


def test_the_dashboard_files_are_what_the_builder_writes():
    spec = importlib.util.spec_from_file_location("build_dashboards", OBSERVABILITY / "grafana" / "build_dashboards.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    rendered = builder.render()
    assert set(rendered) == {p.name for p in DASHBOARD_DIR.glob("*.json")}
    for name, text in rendered.items():
        assert (DASHBOARD_DIR / name).read_text() == text, f"{name} is stale: run build_dashboards.py"


def test_every_panel_has_a_provisioned_datasource_and_queries():
    uids = {ds["uid"] for ds in _datasources()}
    for name, dashboard in _dashboards().items():
        for panel in _panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] in uids, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["expr"].strip() and target["datasource"]["uid"] in uids, (name, panel["title"])


def test_dashboards_use_only_catalogued_metric_names():
    catalog = _catalog()
    assert len(catalog) >= 30, "the catalog table format changed"
    for name, dashboard in _dashboards().items():
        used = set(re.findall(r"\btandem_\w+", json.dumps(dashboard)))
        for metric in used:
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert metric in catalog or base in catalog, f"{name}: {metric} is not in observability/README.md"


def test_every_catalogued_area_is_on_a_dashboard():
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for _, _, e in _exprs() for m in re.findall(r"\btandem_\w+", e)}
    # what an operator asked for; the rest of the catalog may stay off the dashboards
    for metric in (
        "tandem_gateway_requests_total",
        "tandem_gateway_time_to_first_token_seconds",
        "tandem_gateway_inter_token_latency_seconds",
        "tandem_gateway_request_duration_seconds",
        "tandem_gateway_goodput_requests_total",
        "tandem_gateway_requests_in_flight",
        "tandem_worker_requests_waiting",
        "tandem_worker_requests_running",
        "tandem_worker_kv_blocks_used",
        "tandem_worker_kv_blocks_total",
        "tandem_worker_prefix_cache_hits_total",
        "tandem_worker_kv_transfer_bytes_total",
        "tandem_worker_kv_transfer_seconds",
        "tandem_worker_preemptions_total",
        "tandem_router_decisions_total",
        "tandem_router_route_seconds",
        "tandem_router_predicted_overlap_ratio",
        "tandem_router_workers",
        "tandem_planner_predicted_load",
        "tandem_planner_replicas_desired",
        "tandem_planner_replicas",
        "tandem_planner_slo_attainment_ratio",
    ):
        assert metric in used, metric


def test_queries_are_plain_promql_with_rate_interval_windows_and_regex_variables():
    for name, title, expr in _exprs():
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", f"{name} / {title}: fixed window [{window}]"
        assert not re.search(r'[!=]="\$', expr), f"{name} / {title}: match variables with =~ (All is .*)"
        assert re.search(r"\brate\(\w+_total\b", expr) or "rate(" not in expr or "_bucket" in expr, (
            f"{name} / {title}: rate() of a non-counter"
        )


def test_template_variables_are_defined_and_documented():
    readme = (OBSERVABILITY / "README.md").read_text()
    dashboards_section = readme.split("## Dashboards", 1)[1] if "## Dashboards" in readme else ""
    for name, dashboard in _dashboards().items():
        defined = {v["name"]: v for v in dashboard["templating"]["list"]}
        used = {m for _, _, e in _exprs() if _ == name for m in re.findall(r"\$(\w+)", e)} - {"__rate_interval"}
        assert used <= set(defined), (name, used - set(defined))
        for var in defined.values():
            assert var["allValue"] == ".*" and var["includeAll"], (name, var["name"])
            assert f"`${var['name']}`" in dashboards_section, f"document ${var['name']} in observability/README.md"


def test_queries_parse_as_promql(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    rules = [{"record": f"dashboard:check_{i}", "expr": _concrete(e)} for i, (_, _, e) in enumerate(_exprs())]
    bad = [{"record": "dashboard:check_bad", "expr": "sum(rate(tandem_gateway_requests_total[1m])"}]
    assert _promtool_rules_ok(promtool, rules, tmp_path / "dashboards.yml")
    assert not _promtool_rules_ok(promtool, bad, tmp_path / "bad.yml")  # the check itself can fail


def _promtool_rules_ok(promtool: str, rules: list[dict], path) -> bool:
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return out.returncode == 0


# --- Grafana provisioning --------------------------------------------------------------------------------------


def test_datasources_point_at_the_compose_services_and_link_traces_and_logs():
    by_uid = {ds["uid"]: ds for ds in _datasources()}
    assert set(by_uid) == {"prometheus", "loki", "tempo"}
    ports = {"prometheus": 9090, "loki": 3100, "tempo": 3200}
    for uid, ds in by_uid.items():
        assert ds["url"] == f"http://{uid}:{ports[uid]}" and uid in SERVICES, uid
    tempo = by_uid["tempo"]["jsonData"]["tracesToLogsV2"]
    assert tempo["datasourceUid"] == "loki" and tempo["filterByTraceID"]
    assert "trace_id" in tempo["query"] and "${__trace.traceId}" in tempo["query"].replace("$$", "$")
    [derived] = by_uid["loki"]["jsonData"]["derivedFields"]
    assert derived["datasourceUid"] == "tempo" and derived["name"] == "trace_id"
    line = json.dumps({"level": "info", "msg": "done", "trace_id": "0af7651916cd43dd8448eb211c80319c"})
    assert re.search(derived["matcherRegex"], line).group(1) == "0af7651916cd43dd8448eb211c80319c"
    assert by_uid["prometheus"]["isDefault"]


def test_the_dashboard_provider_reads_the_directory_compose_mounts():
    [provider] = yaml.safe_load((PROVISIONING / "dashboards" / "tandem.yaml").read_text())["providers"]
    mounts = dict(reversed(v.split(":")[:2]) for v in SERVICES["grafana"]["volumes"])
    assert mounts[provider["options"]["path"]] == "./observability/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./observability/grafana/provisioning"
    home = environment(SERVICES["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARD_DIR / home.rsplit("/", 1)[1]).is_file()


def test_grafana_wants_a_login_and_its_admin_password_from_the_environment():
    env = environment(SERVICES["grafana"])
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false" and env["GF_USERS_VIEWERS_CAN_EDIT"] == "false"
    raw = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["grafana"]["environment"]
    assert raw["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")  # no default: compose refuses
    assert "127.0.0.1:3000:3000" in SERVICES["grafana"]["ports"]


# --- Prometheus, Loki, Tempo, Alloy --------------------------------------------------------------------------


def test_prometheus_finds_every_tandem_service_compose_starts():
    config = yaml.safe_load((OBSERVABILITY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["gateway:8000"]
    assert "--port" in SERVICES["gateway"]["command"]
    assert SERVICES["gateway"]["command"][SERVICES["gateway"]["command"].index("--port") + 1] == "8000"
    aliases = {a for s in SERVICES.values() for a in s.get("networks", {}).get("default", {}).get("aliases", [])}
    for job, names in (("router", ["router"]), ("prefill", ["tandem-prefill"]), ("decode", ["tandem-decode"])):
        [sd] = jobs[job]["dns_sd_configs"]
        assert sd["names"] == names and sd["type"] == "A" and sd["port"] == 9464, job
        assert all(n in SERVICES or n in aliases for n in names), job
    assert all(
        environment(SERVICES[n]).get("TANDEM_WORKER_METRICS_PORT") == "9464"
        for n in SERVICES
        if n.startswith(("prefill", "decode"))
    )
    mounted = [v for v in SERVICES["prometheus"]["volumes"] if v.startswith("./")]
    assert mounted == ["./observability/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"]


def test_the_local_prometheus_config_reads_tandem_ups_targets_file_next_to_it():
    config = yaml.safe_load((OBSERVABILITY / "prometheus" / "prometheus-local.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == ["prometheus-targets.json"]
    assert "prometheus-targets.json" in (REPO / "tandem" / "launcher.py").read_text()


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-local.yml"])
def test_prometheus_configs_pass_promtool(name, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it)")
    config = tmp_path / name
    config.write_text((OBSERVABILITY / "prometheus" / name).read_text())
    (tmp_path / "prometheus-targets.json").write_text(
        json.dumps([{"targets": ["127.0.0.1:9464"], "labels": {"service": "router"}}])
    )
    out = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_tempo_receives_otlp_on_both_ports_and_stores_locally():
    config = yaml.safe_load((OBSERVABILITY / "tempo" / "tempo.yaml").read_text())
    otlp = config["distributor"]["receivers"]["otlp"]["protocols"]
    assert otlp["grpc"]["endpoint"].endswith(":4317") and otlp["http"]["endpoint"].endswith(":4318")
    assert config["storage"]["trace"]["backend"] == "local"
    assert config["server"]["http_listen_port"] == 3200


def test_loki_keeps_structured_metadata():
    config = yaml.safe_load((OBSERVABILITY / "loki" / "loki.yaml").read_text())
    assert config["limits_config"]["allow_structured_metadata"] is True
    assert config["schema_config"]["configs"][0]["schema"] == "v13"  # structured metadata needs tsdb + v13
    assert config["server"]["http_listen_port"] == 3100


def test_alloy_labels_streams_by_level_and_service_and_keeps_trace_id_off_the_labels():
    text = (OBSERVABILITY / "alloy" / "config.alloy").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))

    def block(name: str) -> str:
        match = re.search(re.escape(name) + r"\s*\{(.*?)\n\s*\}", code, flags=re.S)
        assert match, name
        return match.group(1)

    labels = set(re.findall(r"(\w+)\s*=", block("stage.labels")))
    assert labels == {"values", "level", "service"}
    assert {"trace_id", "span_id"} <= set(re.findall(r"(\w+)\s*=", block("stage.structured_metadata")))
    assert 'url = "http://loki:3100/loki/api/v1/push"' in code
    assert 'host             = "unix:///var/run/docker.sock"' in code
    assert "/var/run/docker.sock:/var/run/docker.sock:ro" in SERVICES["alloy"]["volumes"]
