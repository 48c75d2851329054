"""Typed errors for fetching, converting and writing checkpoints; the CLI maps them to exit codes."""


class ModelError(Exception):
    """Base class: anything in tandem.models that fails for a reason the user can fix."""


class ModelFetchError(ModelError):
    """No local directory, no hub, and no offline source for the requested model id."""


class GGUFConversionError(ModelError):
    """The GGUF file uses an architecture, tokenizer or tensor this converter does not handle."""


class CheckpointWriteError(ModelError):
    """The output directory cannot be written (e.g. it holds files that are not a tandem checkpoint)."""
