"""What the deployment tests read: compose.yaml with its ${VAR:-default} values filled in, and the repo's paths."""
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "compose.yaml"
OBSERVABILITY = REPO / "observability"

_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?::?[-?]([^}]*))?\}|\$(\w+)")


def interpolate(value):
    """Compose's interpolation with an empty environment: ${VAR:-default} -> default, $$ -> $."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: "$" if m.group(0) == "$$" else (m.group(2) or ""), value)
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
    return any(dep.get("condition") == "service_completed_successfully"
               for other in services.values() for dep_name, dep in _depends(other).items() if dep_name == name)


def _depends(service: dict) -> dict:
    deps = service.get("depends_on", {})
    return {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
