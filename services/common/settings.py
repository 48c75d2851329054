"""Reading settings from TANDEM_* environment variables, with clear errors for bad values."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting has a value the service cannot start with."""


# secrets a deployment may hand over as a file (NAME_FILE: compose's volumes, Kubernetes' Secrets) rather than a
# value in the environment, where `docker inspect` and /proc/<pid>/environ show it
FILE_SECRETS = frozenset({"TANDEM_KV_HASH_SECRET", "TANDEM_REDIS_PASSWORD"})


def env(name: str, default: T, cast: Callable[[str], T] | None = None) -> T:
    raw = os.environ.get(name)
    if not raw and name in FILE_SECRETS:
        raw = _secret_file(name)
    if raw is None or raw == "":
        return default
    caster = cast or (type(default) if default is not None else str)
    if caster is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True  # type: ignore[return-value]
        if raw.lower() in ("0", "false", "no", "off"):
            return False  # type: ignore[return-value]
        raise SettingsError(f"{name}={raw!r} is not a boolean")
    try:
        return caster(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r}: {exc}") from None


def _secret_file(name: str) -> str | None:
    path = os.environ.get(name + "_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise SettingsError(f"{name}_FILE={path!r}: {exc.strerror or exc}") from None
