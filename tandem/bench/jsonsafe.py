"""JSON documents that stay valid: NaN and infinities become null. No heavy imports (the CLI loads this)."""

import math


def json_safe(value):
    """NaN and infinities become null: the document must stay valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
