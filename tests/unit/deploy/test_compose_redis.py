"""The Responses API's shared store in compose.yaml: Redis built here from Debian's package (no registry image), in
the `redis` profile, on a network only the gateway joins, publishing nothing; the gateway's settings point at it
when asked (TANDEM_RESPONSE_STORE=redis), and its default SQLite store lives in a writable volume of its own."""

import pytest

from tests.unit.deploy.helpers import REPO, check_command, environment, load_compose

COMPOSE = load_compose()
SERVICES = COMPOSE["services"]
REDIS = SERVICES["redis"]


def test_redis_is_built_from_debians_package_in_its_own_profile():
    assert REDIS["profiles"] == ["redis"] and "image" in REDIS and "build" in REDIS
    dockerfile = (REPO / REDIS["build"]["context"] / REDIS["build"]["dockerfile"]).read_text()
    assert "apt-get install" in dockerfile and "redis-server" in dockerfile
    assert "\nUSER redis\n" in dockerfile and "redis.conf /usr/local/etc/tandem-redis.conf" in dockerfile
    assert (REPO / REDIS["build"]["context"] / "redis.conf").is_file()
    assert REDIS["healthcheck"]["test"][0] == "CMD-SHELL" and "REDISCLI_AUTH=" in REDIS["healthcheck"]["test"][1]
    assert REDIS["restart"] == "unless-stopped"
    assert "redis-data:/data" in REDIS["volumes"] and "redis-data" in COMPOSE["volumes"]


def test_only_the_gateway_reaches_redis_and_redis_publishes_nothing():
    assert "ports" not in REDIS and REDIS["networks"] == {"responses": {}}
    on_network = sorted(n for n, s in SERVICES.items() if "responses" in (s.get("networks") or []))
    assert on_network == ["gateway", "redis"]
    assert COMPOSE["networks"]["responses"]["internal"] is True


def test_the_redis_config_listens_for_the_gateway_and_refuses_admin_commands():
    conf = dict(
        line.split(None, 1)
        for line in (REPO / "docker" / "redis.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith("rename-command")
    )
    assert conf["bind"] == "0.0.0.0" and conf["port"] == "6379" and conf["dir"] == "/data"
    assert conf["appendonly"] == "yes" and conf["maxmemory-policy"] == "volatile-ttl"
    renamed = {
        line.split()[1]
        for line in (REPO / "docker" / "redis.conf").read_text().splitlines()
        if line.startswith("rename-command")
    }
    assert {"FLUSHALL", "FLUSHDB", "CONFIG", "DEBUG", "SHUTDOWN", "MODULE"} <= renamed


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_the_gateway_uses_the_store_it_is_given(store, monkeypatch):
    env = environment(SERVICES["gateway"]) | ({"TANDEM_RESPONSE_STORE": "redis"} if store == "redis" else {})
    settings = check_command(SERVICES["gateway"]["command"], env, monkeypatch)
    assert settings.response_store == store
    assert settings.redis_url == "redis://redis:6379/0"  # the service's name on the responses network
    volume = settings.response_store_path.rsplit("/", 1)[0]
    assert f"gateway-responses:{volume}" in SERVICES["gateway"]["volumes"]  # writable: /cache is read-only


def test_redis_requires_the_password_the_certs_service_made_and_the_gateway_sends_it(monkeypatch, tmp_path):
    command = " ".join(REDIS["command"])
    assert "--requirepass" in command and "$(cat /etc/tandem/redis/redis.password)" in command
    assert "tls-redis:/etc/tandem/redis:ro" in REDIS["volumes"]
    assert REDIS["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    holders = sorted(
        n for n, s in SERVICES.items() if any(str(v).startswith("tls-redis:") for v in s.get("volumes", []))
    )
    assert holders == ["certs", "redis"]
    env = environment(SERVICES["gateway"]) | {"TANDEM_RESPONSE_STORE": "redis"}
    assert env["TANDEM_REDIS_PASSWORD_FILE"] == "/etc/tandem/tls/redis.password"  # the gateway's own volume
    assert "TANDEM_REDIS_PASSWORD" not in env and "@" not in env["TANDEM_REDIS_URL"]  # never in the environment
    settings = check_command(SERVICES["gateway"]["command"], env, monkeypatch)
    assert settings.redis_password == "cd" * 24  # read from the file (here the test's stand-in)
    assert "cd" * 24 not in repr(settings)
