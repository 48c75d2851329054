"""Typed engine errors. Services map these to gRPC statuses and HTTP errors in one place each."""


class EngineError(Exception):
    """Base class of every error an engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is wrong (empty prompt, too long, bad sampling parameters)."""


class RequestNotFoundError(EngineError, KeyError):
    """No live request (or held KV) under this req_id."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "request not found"


class ModelNotFoundError(EngineError, FileNotFoundError):
    """The model directory does not exist or lacks config.json / weights."""


class UnsupportedArchitectureError(EngineError):
    """The checkpoint's architecture is not one this engine implements."""


class KvLayoutMismatchError(EngineError, ValueError):
    """Imported KV blocks do not match this engine's layout (layers, heads, dtype, block size)."""


class EngineBusyError(EngineError):
    """The operation needs an idle engine (e.g. resetting the prefix cache while requests hold blocks)."""


class EngineUnavailableError(EngineError):
    """The engine cannot run on this host as configured: its package, its device or a checkpoint it needs is
    missing. Raised at start-up; the message says what is missing and how to get it."""


class EngineDiedError(EngineError):
    """The engine (its process) is gone: its requests failed and it serves no more."""
