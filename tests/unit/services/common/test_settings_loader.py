"""The one settings loader: every service reads the same variables and flags as before it (a recorded set), the
names derive from the fields, flags win over variables, and a bad value is a SettingsError naming the variable."""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.common.settings import SettingsError
from services.common.settings_loader import Source, parse_bool
from tests.unit.services.common.settings_names import names

SNAPSHOT = Path(__file__).with_name("settings_names.json")


def test_every_service_reads_the_names_it_read_before_the_loader():
    # NOTE: the snapshot was recorded from the hand-written loaders; a change here renames a deployed setting
    assert names() == json.loads(SNAPSHOT.read_text())


@dataclass(frozen=True, slots=True)
class Demo:
    port: int = 1
    rate_s: float = 0.5
    name: str = "x"
    is_on: bool = True
    enable_cache: bool = True

    def __post_init__(self) -> None:
        if self.port < 0:
            raise SettingsError(f"port must be >= 0, got {self.port}")


SOURCE = Source(Demo, "TANDEM_DEMO_", env={"name": "TANDEM_NAME"}, negated=("enable_cache",))


def parse(argv: list[str]) -> Demo:
    parser = argparse.ArgumentParser()
    SOURCE.add_arguments(parser)
    return SOURCE.load(parser.parse_args(argv))


def test_names_derive_from_the_fields_unless_declared():
    got = {s.name: (s.env, s.flags) for s in SOURCE.settings()}
    assert got == {
        "port": ("TANDEM_DEMO_PORT", ("--port",)),
        "rate_s": ("TANDEM_DEMO_RATE_S", ("--rate-s",)),
        "name": ("TANDEM_NAME", ("--name",)),
        "is_on": ("TANDEM_DEMO_IS_ON", ("--is-on",)),
        "enable_cache": ("TANDEM_DEMO_ENABLE_CACHE", ("--no-cache",)),
    }


def test_flag_over_variable_over_default(monkeypatch):
    assert parse([]) == Demo()
    monkeypatch.setenv("TANDEM_DEMO_PORT", "7")
    monkeypatch.setenv("TANDEM_NAME", "env")
    monkeypatch.setenv("TANDEM_DEMO_IS_ON", "off")
    assert parse(["--port", "9"]) == Demo(port=9, name="env", is_on=False)
    assert parse(["--is-on", "yes", "--no-cache"]) == Demo(port=7, name="env", is_on=True, enable_cache=False)


def test_a_bad_variable_names_itself(monkeypatch):
    monkeypatch.setenv("TANDEM_DEMO_RATE_S", "fast")
    with pytest.raises(SettingsError, match="TANDEM_DEMO_RATE_S='fast'"):
        parse([])


def test_the_class_checks_still_run():
    with pytest.raises(SettingsError, match="port must be >= 0, got -1"):
        parse(["--port", "-1"])


def test_a_bad_flag_stops_the_parser_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["--is-on", "maybe"])
    assert exc.value.code == 2
    assert "'maybe' is not a boolean" in capsys.readouterr().err


def test_parse_bool_spellings():
    assert [parse_bool(v) for v in ("1", "TRUE", "on", "0", "no", "Off")] == [True] * 3 + [False] * 3


def _worker_main(argv):
    from services.common.roles import WorkerRole
    from services.common.worker_base import main_for

    return main_for(WorkerRole.DECODE, object, argv)  # NOTE: the settings fail before the service class is used


def _planner_main(argv):
    from services.planner.server import main

    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def _main(module: str):
    import importlib

    return importlib.import_module(module).main


@pytest.mark.parametrize(
    "service,variable,value",
    [
        ("gateway", "TANDEM_GATEWAY_PORT", "http"),
        ("router", "TANDEM_ROUTER_LEASE_TTL_S", "soon"),
        ("planner", "TANDEM_PLANNER_TICK_S", "-1"),
        ("scaler", "TANDEM_SCALER_PORT", "x"),
        ("decode", "TANDEM_WORKER_MAX_NUM_SEQS", "many"),
    ],
)
def test_a_bad_variable_stops_every_service_with_one_line_and_exit_2(service, variable, value, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_MODEL", "/m")
    monkeypatch.setenv("TANDEM_SCALER_PROJECT", "p")
    monkeypatch.setenv("TANDEM_SCALER_TOKEN_FILE", "/nonexistent/token")
    monkeypatch.setenv(variable, value)
    main = {
        "gateway": lambda: _main("services.gateway.server"),
        "router": lambda: _main("services.router.server"),
        "scaler": lambda: _main("services.scaler.server"),
        "planner": lambda: _planner_main,
        "decode": lambda: _worker_main,
    }[service]()
    assert main([]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert variable in line or variable.removeprefix("TANDEM_").split("_", 1)[1].lower() in line


@dataclass(frozen=True, slots=True)
class Limits:
    max_items: int = 4
    hidden_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")


@dataclass(frozen=True, slots=True)
class Nested:
    port: int = 1
    limits: Limits = Limits(max_items=8)  # the service's own default of a shared sub-config


NESTED = Source(Nested, "TANDEM_DEMO_", kept=("hidden_s",))


def test_a_sub_configs_fields_are_named_as_if_flat_and_built_whole(monkeypatch):
    got = {s.name: (s.env, s.flags, s.default, s.group) for s in NESTED.settings()}
    assert got == {
        "port": ("TANDEM_DEMO_PORT", ("--port",), 1, ""),
        "max_items": ("TANDEM_DEMO_MAX_ITEMS", ("--max-items",), 8, "limits"),
    }
    assert NESTED.load() == Nested()
    monkeypatch.setenv("TANDEM_DEMO_MAX_ITEMS", "3")
    assert NESTED.load({"port": 2}) == Nested(2, Limits(max_items=3))


def test_a_sub_configs_own_check_is_a_settings_error(monkeypatch):
    monkeypatch.setenv("TANDEM_DEMO_MAX_ITEMS", "0")
    with pytest.raises(SettingsError, match="max_items must be >= 1, got 0"):
        NESTED.load()


@dataclass(frozen=True, slots=True)
class Backend:
    mode: str = "a"


@dataclass(frozen=True, slots=True)
class WithBackend:
    backend: Backend = Backend()


def test_a_prefixed_sub_configs_fields_take_its_prefix(monkeypatch):
    source = Source(WithBackend, "TANDEM_DEMO_", prefixed={"backend": "be_"})
    (s,) = source.settings()
    assert (s.name, s.env, s.flags, s.group) == ("be_mode", "TANDEM_DEMO_BE_MODE", ("--be-mode",), "backend")
    monkeypatch.setenv("TANDEM_DEMO_BE_MODE", "b")
    assert source.load() == WithBackend(Backend("b"))
