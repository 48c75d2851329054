"""The engine contract shared by every backend. Imports no torch."""

from engines.base.block_hash import NONE_HASH, chain_block_hashes, hash_block
from engines.base.engine import Engine
from engines.base.errors import (
    EngineBusyError,
    EngineDiedError,
    EngineError,
    EngineUnavailableError,
    InvalidRequestError,
    KvLayoutMismatchError,
    ModelNotFoundError,
    RequestNotFoundError,
    UnsupportedArchitectureError,
)
from engines.base.types import (
    EngineRequest,
    EngineStats,
    FinishReason,
    KvExport,
    KvLayout,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)

__all__ = [
    "NONE_HASH",
    "chain_block_hashes",
    "hash_block",
    "Engine",
    "EngineBusyError",
    "EngineDiedError",
    "EngineError",
    "EngineUnavailableError",
    "InvalidRequestError",
    "KvLayoutMismatchError",
    "ModelNotFoundError",
    "RequestNotFoundError",
    "UnsupportedArchitectureError",
    "EngineRequest",
    "EngineStats",
    "FinishReason",
    "KvExport",
    "KvLayout",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]
