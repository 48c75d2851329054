"""The gateway's one frozen settings object, from TANDEM_* environment variables overridden by CLI flags.

A bad value raises SettingsError at start-up; nothing changes the settings afterwards.
"""

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from services.common.settings import SettingsError
from services.common.settings_loader import Source
from services.gateway.chat_output import REASONING_PARSERS
from services.gateway.tenancy import SHARING_MODES
from services.gateway.tool_parsers import PARSER_NAMES

MAX_WORKERS = 64
RESPONSE_STORES = ("sqlite", "redis")


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    model_dir: str
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str = ""  # "" = the model directory's name
    router_address: str = "127.0.0.1:50051"
    route_model: str = ""  # the model as workers register it with the router; "" = model_dir as given
    api_keys: tuple[str, ...] = ()  # empty = no authentication
    api_keys_file: str = ""  # or the keys from this file (a mounted Secret): one per line or comma-separated
    max_body_bytes: int = 1 << 20
    max_inflight: int = 256
    request_timeout_s: float = 600.0
    route_timeout_s: float = 5.0
    log_level: str = "info"
    slo_ttft_s: float = 2.0  # goodput: a request met its SLOs when its first token came within this ...
    slo_itl_s: float = 0.1  # ... and its mean inter-token latency stayed within this
    num_workers: int = 1  # gateway processes sharing the port (> 1: a supervisor process starts them)
    drain_timeout_s: float = 30.0  # at SIGTERM: how long streams in flight may take to finish
    max_migrations: int = 3  # times one request may move to another worker when its own fails mid-stream; 0: never
    tool_parser: str = "auto"  # the model's tool-call format: auto (from the template), hermes, llama3_json, mistral
    reasoning_parser: str = ""  # "": none; think: <think>...</think> goes to reasoning_content
    response_store: str = "sqlite"  # where /v1/responses keeps stored responses: sqlite (one host) | redis (shared)
    response_store_path: str = ""  # sqlite's file; "" = responses.sqlite3 under the cache directory
    redis_url: str = ""  # the redis store's server, e.g. redis://host:6379/0
    # the redis server's requirepass (TANDEM_REDIS_PASSWORD, or a file: TANDEM_REDIS_PASSWORD_FILE); "": none
    redis_password: str = field(default="", repr=False)
    response_ttl_s: float = 30 * 24 * 3600.0  # how long a stored response may be read back (OpenAI keeps 30 days)
    # tenants (docs/security-tenants.md): per-key: each API key's prompts share cached KV only with its own
    cache_sharing: str = "per-key"
    kv_hash_secret: str = field(default="", repr=False)  # keys block hashes and tenant ids; the same on every service
    max_inflight_per_key: int = 64  # sequences one API key may have in flight (n counts each); 0: no per-key limit
    tokens_per_minute_per_key: int = 0  # prompt + generated tokens one API key may spend per minute; 0: no limit
    max_prompt_chars: int = 1 << 19  # messages (and the chat template's output) or a prompt, before tokenizing

    def __post_init__(self) -> None:
        if not self.model_dir:
            raise SettingsError("the model is required: --model PATH or TANDEM_MODEL")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        for name in (
            "max_body_bytes",
            "max_inflight",
            "request_timeout_s",
            "route_timeout_s",
            "slo_ttft_s",
            "slo_itl_s",
            "drain_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_migrations < 0:
            raise SettingsError(f"max_migrations must be >= 0, got {self.max_migrations}")
        if self.tool_parser not in PARSER_NAMES:
            raise SettingsError(f"tool_parser must be one of {', '.join(PARSER_NAMES)}, got {self.tool_parser!r}")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise SettingsError(f"reasoning_parser must be '' or 'think', got {self.reasoning_parser!r}")
        if not 1 <= self.num_workers <= MAX_WORKERS:
            raise SettingsError(f"num_workers must be in [1, {MAX_WORKERS}], got {self.num_workers}")
        _check_store(self)
        _check_tenancy(self)

    @property
    def model_name(self) -> str:
        """The name clients put in `model`."""
        return self.served_model_name or Path(self.model_dir).name

    @property
    def response_store_file(self) -> Path:
        """The SQLite store's file: the setting, else under TANDEM_CACHE_DIR (or ~/.cache/tandem)."""
        if self.response_store_path:
            return Path(self.response_store_path)
        root = os.environ.get("TANDEM_CACHE_DIR")
        return (Path(root) if root else Path.home() / ".cache" / "tandem") / "responses.sqlite3"

    @property
    def router_model(self) -> str:
        """The model key of Route requests: workers register with their --model string."""
        return self.route_model or self.model_dir


def _check_store(s: GatewaySettings) -> None:
    if s.response_store not in RESPONSE_STORES:
        raise SettingsError(f"response_store must be one of {', '.join(RESPONSE_STORES)}, got {s.response_store!r}")
    if s.response_store == "redis" and not s.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(
            "the redis response store needs --redis-url (TANDEM_REDIS_URL) as redis://host:port/db, "
            f"rediss://... or unix://...; got {s.redis_url!r}"
        )
    if s.response_ttl_s <= 0:
        raise SettingsError(f"response_ttl_s must be > 0, got {s.response_ttl_s}")


def _check_tenancy(s: GatewaySettings) -> None:
    if s.cache_sharing not in SHARING_MODES:
        raise SettingsError(f"cache_sharing must be one of {', '.join(SHARING_MODES)}, got {s.cache_sharing!r}")
    if s.max_inflight_per_key < 0 or s.tokens_per_minute_per_key < 0:
        raise SettingsError(
            f"max_inflight_per_key and tokens_per_minute_per_key must be >= 0 (0: off), got "
            f"{s.max_inflight_per_key} and {s.tokens_per_minute_per_key}"
        )
    if s.max_prompt_chars < 1:
        raise SettingsError(f"max_prompt_chars must be >= 1, got {s.max_prompt_chars}")


def _keys(raw: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in raw.replace("\n", ",").split(",") if k.strip() and not k.strip().startswith("#"))


def _keys_from_file(path: str, inline: tuple[str, ...]) -> tuple[str, ...]:
    """The keys a Secret mounted as a file holds; a file that names none would silently turn authentication off."""
    if inline:
        raise SettingsError("give the API keys either inline (TANDEM_API_KEYS) or as a file (TANDEM_API_KEYS_FILE)")
    try:
        keys = _keys(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"TANDEM_API_KEYS_FILE: {exc}") from None
    if not keys:
        raise SettingsError(f"TANDEM_API_KEYS_FILE {path} names no key (unset the variable to run without keys)")
    return keys


# the gateway's variables grew before the loader: most are TANDEM_GATEWAY_<FIELD>, these are spelled otherwise
SOURCE = Source(
    GatewaySettings,
    "TANDEM_GATEWAY_",
    env={
        "model_dir": "TANDEM_MODEL",
        "served_model_name": "TANDEM_SERVED_MODEL_NAME",
        "router_address": "TANDEM_ROUTER_ADDRESS",
        "api_keys": "TANDEM_API_KEYS",
        "api_keys_file": "TANDEM_API_KEYS_FILE",
        "log_level": "TANDEM_LOG_LEVEL",
        "slo_ttft_s": "TANDEM_SLO_TTFT_S",
        "slo_itl_s": "TANDEM_SLO_ITL_S",
        "num_workers": "TANDEM_GATEWAY_WORKERS",
        "tool_parser": "TANDEM_TOOL_PARSER",
        "reasoning_parser": "TANDEM_REASONING_PARSER",
        "response_store": "TANDEM_RESPONSE_STORE",
        "response_store_path": "TANDEM_RESPONSE_STORE_PATH",
        "redis_url": "TANDEM_REDIS_URL",
        "redis_password": "TANDEM_REDIS_PASSWORD",
        "response_ttl_s": "TANDEM_RESPONSE_TTL_S",
        "cache_sharing": "TANDEM_CACHE_SHARING",
        "kv_hash_secret": "TANDEM_KV_HASH_SECRET",
    },
    flags={"model_dir": ("--model", "--model-dir"), "num_workers": ("--workers", "--num-workers")},
    casts={"api_keys": _keys},
    help={
        "model_dir": "model directory: tokenizer, chat template, context length",
        "host": "the address the HTTP server binds",
        "port": "HTTP port",
        "router_address": "the router's gRPC address",
        "api_keys": "comma-separated keys; when set, `Authorization: Bearer <key>` is required (401 otherwise)",
        "max_body_bytes": "larger bodies get 413",
        "max_inflight": "requests in flight before 429 with Retry-After",
        "request_timeout_s": "a request that takes longer gets 504 timeout_error",
        "route_timeout_s": "how long a request waits for the router's answer before 503",
        "log_level": "a logging level name (debug, info, warning, error)",
    },
)


def from_env(**overrides) -> GatewaySettings:
    """Defaults, then TANDEM_* variables, then `overrides` (what CLI flags or tests pass)."""
    values = SOURCE.values(overrides)
    if values["api_keys_file"]:  # NOTE: read once, at start-up; a new key needs a restart (a rollout on k8s)
        values["api_keys"] = _keys_from_file(values["api_keys_file"], values["api_keys"])
    return GatewaySettings(**values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem serve gateway", description="OpenAI-compatible HTTP gateway (flags override TANDEM_* env)"
    )
    SOURCE.add_arguments(parser)
    return parser


def parse_args(argv: list[str] | None = None) -> GatewaySettings:
    args = build_parser().parse_args(argv)
    return from_env(**vars(args))
