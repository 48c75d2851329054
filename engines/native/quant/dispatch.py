"""Which GEMM a quantized layer runs for a batch of m rows, decided per (layer shape, m bucket) by
timing the candidates once on the device, then remembered for the process.

m buckets are powers of two, so a decode batch and the CUDA-graph bucket it pads to share a choice.
Nothing is timed while a CUDA graph is being captured: capture replays shapes its warm-up already ran.
"""

from collections.abc import Callable

import torch

_WARMUP, _REPEATS = 2, 5
_choices: dict[tuple, str] = {}


def m_bucket(num_rows: int) -> int:
    return 1 << max(0, num_rows - 1).bit_length()


def known(key: tuple) -> str | None:
    """The choice already made for `key`, if any."""
    return _choices.get(key)


def choose(key: tuple, candidates: dict[str, Callable[[], object]], fallback: str, timer=None) -> str:
    """The fastest candidate for `key` (timed on first use); `fallback` where nothing can be timed.
    timer(name, fn) -> seconds per call of fn (default: CUDA events on the current device)."""
    if key in _choices:
        return _choices[key]
    timer = timer or _cuda_timer()
    if timer is None:
        return fallback
    seconds = {name: timer(name, fn) for name, fn in candidates.items()}
    _choices[key] = pick(seconds)
    return _choices[key]


def pick(seconds: dict[str, float]) -> str:
    """The candidate with the least time; ties go to the first listed."""
    return min(seconds, key=lambda name: (seconds[name], list(seconds).index(name)))


def forget() -> None:
    _choices.clear()


def _cuda_timer() -> Callable[[str, Callable], float] | None:
    if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
        return None

    def time_on_device(name: str, fn: Callable) -> float:
        for _ in range(_WARMUP):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(_REPEATS):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / _REPEATS

    return time_on_device
