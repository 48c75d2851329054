"""The one settings loader every service uses: from a frozen settings dataclass it derives each field's TANDEM_*
variable and CLI flag (a field holding a frozen sub-config: each of its fields, named as if flat), reads them (flag
over variable over default) and builds the object, whose own checks run. It holds no service's rules: names that
break the pattern are declared by the service's Source."""

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.settings import SettingsError, env

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Setting:
    """How one field is read: its variable, its flags, the cast of a raw string, its default and its help."""

    name: str
    env: str
    flags: tuple[str, ...]
    cast: Callable[[str], Any]
    default: Any
    help: str = ""
    negated: bool = False  # a boolean whose one flag turns it off (--no-prefix-caching)
    group: str = ""  # the settings field holding the sub-config this field belongs to; "": the settings' own


@dataclass(frozen=True, slots=True)
class Source:
    """A service's settings class and the few names that do not follow `prefix + FIELD` / `--field`."""

    cls: type
    prefix: str
    env: Mapping[str, str] = field(default_factory=dict)  # field -> variable
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # field -> flags
    casts: Mapping[str, Callable[[str], Any]] = field(default_factory=dict)  # field -> cast of a raw string
    help: Mapping[str, str] = field(default_factory=dict)
    fixed: tuple[str, ...] = ()  # fields the caller passes (a worker's role), never read
    negated: tuple[str, ...] = ()  # booleans given by one --no-... flag
    kept: tuple[str, ...] = ()  # sub-config fields this service never reads: they keep the sub-config's default
    prefixed: Mapping[str, str] = field(default_factory=dict)  # sub-config field -> what its fields' names take first

    def settings(self) -> tuple[Setting, ...]:
        out: list[Setting] = []
        for f in dataclasses.fields(self.cls):
            if f.name in self.fixed:
                continue
            sub = sub_config(f)
            if sub is None:
                out.append(self._setting(f, f.default))
            else:  # NOTE: one level deep, each field named as if it were the settings' own
                pre = self.prefixed.get(f.name, "")
                out += [
                    self._setting(g, getattr(sub, g.name), f.name, pre)
                    for g in dataclasses.fields(sub)
                    if g.name not in self.kept
                ]
        return tuple(out)

    def _setting(self, f: dataclasses.Field, default: Any, group: str = "", pre: str = "") -> Setting:
        default = default if default is not dataclasses.MISSING else ""
        name = pre + f.name
        dashed = name.replace("_", "-")
        flags = self.flags.get(name) or (
            (f"--no-{dashed.removeprefix('enable-')}",) if name in self.negated else (f"--{dashed}",)
        )
        return Setting(
            name,
            self.env.get(name, self.prefix + name.upper()),
            flags,
            self.casts.get(name) or _cast_of(default),
            default,
            self.help.get(name, ""),
            name in self.negated,
            group,
        )

    def setting(self, name: str) -> Setting:
        """One field's variable, flags and default: what a helper beside the service (tandem/) names."""
        (found,) = (s for s in self.settings() if s.name == name)
        return found

    def read(self, name: str) -> Any:
        """One field's value from its variable alone, or its default."""
        s = self.setting(name)
        return env(s.env, s.default, s.cast)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """One flag per setting; an absent flag (None) keeps the variable's value."""
        for s in self.settings():
            text = f"{s.help + ' ' if s.help else ''}(env {s.env}, default {s.default!r})"
            if s.negated:
                parser.add_argument(*s.flags, dest=s.name, action="store_false", default=None, help=text)
            else:
                parser.add_argument(*s.flags, dest=s.name, type=_flag_type(s.cast), default=None, help=text)

    def load(self, overrides: Mapping[str, Any] | argparse.Namespace = (), **fixed: Any) -> Any:
        """Defaults, then the variables, then the non-None overrides (parsed flags); raises SettingsError."""
        return self.cls(**fixed, **self.compose(self.values(overrides)))

    def compose(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Flat values by field name into the settings' keywords: each sub-config built from its fields' values
        (over its default), its own check's ValueError raised as a SettingsError."""
        out = dict(values)
        for f in dataclasses.fields(self.cls):
            sub = sub_config(f)
            if sub is None:
                continue
            pre = self.prefixed.get(f.name, "")
            own = {s.name[len(pre) :]: out.pop(s.name) for s in self.settings() if s.group == f.name and s.name in out}
            try:
                out[f.name] = dataclasses.replace(sub, **own)
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
        return out

    def values(self, overrides: Mapping[str, Any] | argparse.Namespace = ()) -> dict[str, Any]:
        values = {s.name: env(s.env, s.default, s.cast) for s in self.settings()}
        if isinstance(overrides, argparse.Namespace):  # NOTE: a parser may hold flags of its own (router's -v)
            overrides = {k: v for k, v in vars(overrides).items() if k in values}
        values.update({k: v for k, v in dict(overrides).items() if v is not None})
        return values


def sub_config(f: dataclasses.Field) -> Any:
    """The default sub-config a settings field holds (a frozen dataclass instance), or None for a plain value."""
    default = f.default
    return default if dataclasses.is_dataclass(default) and not isinstance(default, type) else None


def _cast_of(default: Any) -> Callable[[str], Any]:
    return type(default) if default is not None else str


def _flag_type(cast: Callable[[str], Any]) -> Callable[[str], Any]:
    return parse_bool if cast is bool else cast


def parse_bool(raw: str) -> bool:
    """A flag's boolean, spelled as the variables' are."""
    if raw.lower() not in _TRUE + _FALSE:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a boolean")
    return raw.lower() in _TRUE
