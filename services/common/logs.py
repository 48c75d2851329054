"""Logging for every service: one JSON object per line on stderr, with the service name, the request id
and the trace and span ids of the current span, so Loki lines and Tempo spans find each other.

`TANDEM_LOG_FORMAT=text` gives plain lines for a terminal; `TANDEM_LOG_LEVEL` sets the level.
Prompt and completion text never go into info-level records.
"""

import contextvars
import json
import logging
import os
import sys
import time

from opentelemetry import trace

# the request a coroutine is working on; set by the service handling it, read by every record
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("tandem_request_id", default="")

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": _iso_time(record.created),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        req_id = getattr(record, "req_id", None) or request_id.get()
        if req_id:
            entry["req_id"] = req_id
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            entry["trace_id"] = format(ctx.trace_id, "032x")
            entry["span_id"] = format(ctx.span_id, "016x")
        for key, value in vars(record).items():  # fields passed with `extra=`
            if key not in _STANDARD_ATTRS and key not in entry and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _iso_time(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def setup_logging(service: str, level: str | None = None) -> None:
    """Replace the root handlers with one stderr handler in the configured format."""
    level = (level or os.environ.get("TANDEM_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("TANDEM_LOG_FORMAT", "json").lower() == "text":
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings as records too, so every line stays JSON
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # through the root handler, in our format
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
