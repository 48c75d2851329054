"""Records which TANDEM_* variables and which flags each service's settings loader reads, by running the loader
itself (not by reading its declarations), so a refactor of the loaders can be checked against what they did before.
`python -m tests.unit.services.common.settings_names > tests/unit/services/common/settings_names.json`"""

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator

from services.common.roles import WorkerRole

# what each service needs to start at all (everything else stays at its default)
REQUIRED = {
    "gateway": {"TANDEM_MODEL": "m"},
    "prefill": {"TANDEM_MODEL": "m"},
    "decode": {"TANDEM_MODEL": "m"},
    "scaler": {"TANDEM_SCALER_PROJECT": "p", "TANDEM_SCALER_TOKEN_FILE": "t"},
}


class _RecordingEnv(dict):
    def __init__(self, base: dict[str, str], seen: set[str]):
        super().__init__(base)
        self.seen = seen

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


@contextlib.contextmanager
def _recording(required: dict[str, str], seen: set[str], flags: set[str]) -> Iterator[None]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | required
    real_environ, real_parse = os.environ, argparse.ArgumentParser.parse_args

    def parse(parser, args=None, namespace=None):
        flags.update(opt for action in parser._actions for opt in action.option_strings if opt not in ("-h", "--help"))
        return real_parse(parser, args, namespace)

    os.environ = _RecordingEnv(base, seen)  # type: ignore[assignment]  # noqa: B003 (records reads; restored below)
    argparse.ArgumentParser.parse_args = parse  # type: ignore[method-assign]
    try:
        yield
    finally:
        os.environ = real_environ  # noqa: B003
        argparse.ArgumentParser.parse_args = real_parse  # type: ignore[method-assign]


def _loaders() -> dict[str, Callable[[], object]]:
    from services.common.worker_settings import parse_worker_settings
    from services.gateway.settings import parse_args as gateway
    from services.planner import server as planner
    from services.router import server as router
    from services.scaler.settings import parse_args as scaler

    return {
        "gateway": lambda: gateway([]),
        "router": lambda: router.build_parser().parse_args([]) and _router(router),
        "planner": lambda: _planner(planner),
        "scaler": lambda: scaler([]),
        "prefill": lambda: parse_worker_settings(WorkerRole.PREFILL, []),
        "decode": lambda: parse_worker_settings(WorkerRole.DECODE, []),
    }


def _router(module) -> object:
    from services.router.settings import settings_from

    return settings_from(module.build_parser().parse_args([]))


def _planner(module) -> object:
    from services.planner.settings import settings_from

    return settings_from(module.build_parser().parse_args([]))


def names() -> dict[str, dict[str, list[str]]]:
    """Per service: the TANDEM_* variables its loader reads and the flags its parser accepts."""
    out = {}
    for service, load in _loaders().items():
        seen: set[str] = set()
        flags: set[str] = set()
        with _recording(REQUIRED.get(service, {}), seen, flags):
            load()
        out[service] = {"env": sorted(n for n in seen if n.startswith("TANDEM_")), "flags": sorted(flags)}
    return out


if __name__ == "__main__":
    json.dump(names(), sys.stdout, indent=1, sort_keys=True)
    print()
