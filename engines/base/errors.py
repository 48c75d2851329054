"""The one hierarchy of errors tandem raises on purpose (engines, router, gateway). Services map them to gRPC
statuses (services/common/errors.py) and HTTP errors (services/gateway/errors.py) in one table each."""


class EngineError(Exception):
    """Base class of every error raised on purpose; `param` names the request field at fault, when one is."""

    def __init__(self, message: str = "", *, param: str | None = None):
        super().__init__(message)
        self.param = param

    @property
    def message(self) -> str:
        return str(self)


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


class UnknownModelError(EngineError, LookupError):
    """No worker has ever registered this model while others are live."""


class NoWorkerAvailableError(EngineError):
    """The model is known but no live, non-excluded worker can take the request."""


class WorkersBusyError(EngineError):
    """Every worker that could take the request is past the busy threshold: load is shed, retry later."""
