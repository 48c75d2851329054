"""A zero-cost engine: no model, tokens at once. For measuring the control plane's own overhead."""
from engines.zero.engine import ZeroCostEngine

__all__ = ["ZeroCostEngine"]
