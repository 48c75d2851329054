"""What the scaler allows: the project it serves, the services it may scale and each one's bounds. Pure: no I/O,
no transport; the server asks it before running anything."""

from collections.abc import Mapping
from dataclasses import dataclass


class ScaleRefused(ValueError):
    """A request outside the allow-list or its bounds; `status` is the HTTP status it earns."""

    def __init__(self, message: str, status: int = 403):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Bounds:
    min_replicas: int
    max_replicas: int


def parse_allow_list(spec: str) -> dict[str, Bounds]:
    """ "prefill=0:4,decode=1:8" -> {service: Bounds}; ValueError says what is wrong."""
    allowed: dict[str, Bounds] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, bounds = item.partition("=")
        low, colon, high = bounds.partition(":")
        if not (sep and colon and name.strip() and low.isdigit() and high.isdigit()):
            raise ValueError(f"{item!r} is not SERVICE=MIN:MAX")
        if int(low) > int(high):
            raise ValueError(f"{item!r}: MIN > MAX")
        allowed[name.strip()] = Bounds(int(low), int(high))
    if not allowed:
        raise ValueError("the allow-list names no service")
    return allowed


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    project: str
    allowed: Mapping[str, Bounds]

    def check_project(self, project: str) -> None:
        if project != self.project:
            raise ScaleRefused(f"project {project!r} is not the one this scaler serves")

    def check_scale(self, project: str, service: str, replicas: int) -> None:
        self.check_project(project)
        bounds = self.allowed.get(service)
        if bounds is None:
            raise ScaleRefused(f"service {service!r} is not in the scaler's allow-list")
        if not bounds.min_replicas <= replicas <= bounds.max_replicas:
            raise ScaleRefused(
                f"{service}: replicas must be in [{bounds.min_replicas}, {bounds.max_replicas}], got {replicas}",
                status=422,
            )
