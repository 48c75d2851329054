"""What the deployment tests read: compose.yaml with its ${VAR:-default} values filled in, the repo's paths, and a
container's command parsed as `tandem` parses it."""

import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "compose.yaml"
OBSERVABILITY = REPO / "observability"

# files a container reads from its secret volumes, which this host does not have: a stand-in of the same kind, so
# the settings' start-up checks (the KV signing key is read and parsed) run as they do in the container
_STAND_INS = {
    "TANDEM_KV_SIGNING_KEY_FILE": "00" * 32,
    "TANDEM_KV_HASH_SECRET_FILE": "ab" * 32,
    "TANDEM_REDIS_PASSWORD_FILE": "cd" * 24,
}

_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::?([-?])([^}]*))?\}|\$(\w+)")


def _stand_in(name: str, value: str) -> str:
    if name not in _STAND_INS or not value:
        return value
    path = Path(tempfile.gettempdir()) / f"tandem-deploy-test-{name.lower()}"
    path.write_text(_STAND_INS[name])
    return str(path)


def interpolate(value):
    """Compose's interpolation with an empty environment: ${VAR:-default} -> default, ${VAR:?error} -> "" (compose
    itself refuses the file then), $$ -> $."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: "$" if m.group(0) == "$$" else (m.group(3) if m.group(2) == "-" else ""), value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def load_compose() -> dict:
    # NOTE: PyYAML resolves the file's anchors and `<<` merge keys as compose does
    return interpolate(yaml.safe_load(COMPOSE_FILE.read_text()))


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def is_one_shot(name: str, services: dict) -> bool:
    """A service others wait on to *finish* (model-fetch): it has no healthcheck to pass."""
    return any(
        dep.get("condition") == "service_completed_successfully"
        for other in services.values()
        for dep_name, dep in _depends(other).items()
        if dep_name == name
    )


def _depends(service: dict) -> dict:
    deps = service.get("depends_on", {})
    return {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps


def check_command(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """Parse a container's command with the parsers `tandem` itself uses, under the container's environment.

    Returns the service's settings object; a wrong flag or a bad value raises (argparse exits: SystemExit).
    """
    from tandem.cli import build_parser

    for name in [k for k in os.environ if k.startswith(("TANDEM_", "OTEL_"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, _stand_in(name, value))
    assert argv[0] == "tandem", argv
    args = build_parser().parse_args(argv[1:])
    if args.command != "serve":
        return args
    rest = [a for a in args.args if a != "--"]
    if args.service == "gateway":
        from services.gateway.settings import parse_args

        return parse_args(rest)
    if args.service == "router":
        from services.router.server import build_parser as router_parser
        from services.router.settings import settings_from

        return settings_from(router_parser().parse_args(rest))
    if args.service == "planner":
        from services.planner.server import build_parser as planner_parser
        from services.planner.settings import settings_from as planner_settings

        return planner_settings(planner_parser().parse_args(rest))
    if args.service == "scaler":
        from services.scaler.settings import parse_args as scaler_args

        return scaler_args(rest)
    from services.common.worker_settings import parse_worker_settings

    return parse_worker_settings(args.service, rest)
