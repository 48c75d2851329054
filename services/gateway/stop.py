"""Stop strings over streamed text: a stop string is never emitted, so text that could be the start of one
is held back until the next delta decides. Pure string logic; aborting the worker is the caller's job."""

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.is_stopped = False

    def push(self, text: str) -> str:
        """Feed a delta; return what is safe to emit. After a match, `is_stopped` is set and the text up
        to (not including) the earliest stop string is the last thing returned."""
        if self.is_stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        cut = self._earliest_match(buffer)
        keep = self._partial_suffix(buffer)
        if cut is not None and len(buffer) - keep >= cut:  # NOTE: no longer stop could still begin before it
            self.is_stopped, self._held = True, ""
            return buffer[:cut]
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At a finish that was not (yet) a stop string: the held text is decided with nothing more to come."""
        held, self._held = self._held, ""
        if self.is_stopped:
            return ""
        cut = self._earliest_match(held)
        if cut is not None:
            self.is_stopped = True
            return held[:cut]
        return held

    def _earliest_match(self, buffer: str) -> int | None:
        hits = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:k]):
                    best = k
                    break
        return best
