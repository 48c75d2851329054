"""The scaler's one frozen settings object, from TANDEM_SCALER_* variables overridden by CLI flags; a bad value
raises SettingsError at start-up."""

import argparse
from dataclasses import dataclass

from services.common.settings import SettingsError
from services.common.settings_loader import Source
from services.scaler.policy import ScalePolicy, parse_allow_list

ENV_PREFIX = "TANDEM_SCALER_"


@dataclass(frozen=True, slots=True)
class ScalerSettings:
    project: str = ""  # the one compose project it scales (required)
    token_file: str = ""  # the bearer token callers present; made (0600) on first start when missing (required)
    services: str = "prefill=0:8,decode=1:8"  # allow-list: SERVICE=MIN:MAX,...
    host: str = "0.0.0.0"
    port: int = 8081
    compose_command: str = "docker compose"
    compose_file: str = "compose.yaml"
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.project:
            raise SettingsError("the scaler needs the compose project it serves: TANDEM_SCALER_PROJECT")
        if not self.token_file:
            raise SettingsError("the scaler needs a token file: TANDEM_SCALER_TOKEN_FILE")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        try:
            parse_allow_list(self.services)
        except ValueError as exc:
            raise SettingsError(f"TANDEM_SCALER_SERVICES: {exc}") from None

    @property
    def policy(self) -> ScalePolicy:
        return ScalePolicy(self.project, parse_allow_list(self.services))


SOURCE = Source(
    ScalerSettings,
    ENV_PREFIX,
    help={
        "host": "the address the HTTP server binds",
        "port": "HTTP port",
        "compose_command": "the command it scales with",
        "compose_file": "the project's compose file",
        "log_level": "a logging level name (debug, info, warning, error)",
    },
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem serve scaler",
        description="scales allow-listed compose services for the planner (flags override TANDEM_SCALER_* env)",
    )
    SOURCE.add_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> ScalerSettings:
    return SOURCE.load(build_parser().parse_args(argv))
