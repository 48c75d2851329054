"""Reading settings from TANDEM_* environment variables, with clear errors for bad values."""
import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting has a value the service cannot start with."""


def env(name: str, default: T, cast: Callable[[str], T] | None = None) -> T:
    raw = os.environ.get(name)
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
