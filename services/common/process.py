"""Process lifecycle that every launcher shares: when a child that keeps exiting may be started again (a pure
policy over exit times), and how a child follows its parent's death. It starts, watches and kills nothing itself.
"""

import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field

PARENT_PID_ENV = "TANDEM_PARENT_PID"  # set by a launcher for its children; read (and removed) by die_with_parent
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """A crash loop is more than `max_restarts` exits within `window_s`; between restarts the wait doubles."""

    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_restarts: int = 5  # in `window_s`; one more exit and the launcher gives up
    window_s: float = 60.0

    def backoff_s(self, num_recent_exits: int) -> float:
        """The wait before the next start after the `num_recent_exits`-th exit in the window (1, 2, ...)."""
        return min(self.initial_backoff_s * 2 ** max(num_recent_exits - 1, 0), self.max_backoff_s)

    def is_crash_loop(self, num_recent_exits: int) -> bool:
        return num_recent_exits > self.max_restarts


@dataclass(slots=True)
class ExitWindow:
    """The exit times of one child (or of a pool) that still count: those within the policy's window."""

    exits: list[float] = field(default_factory=list)

    def recent(self, now: float, window_s: float) -> int:
        self.exits = [t for t in self.exits if now - t < window_s]
        return len(self.exits)

    def record(self, now: float, window_s: float) -> int:
        """One more exit at `now`; how many exits the window now holds, this one included."""
        self.exits.append(now)
        return self.recent(now, window_s)


def exit_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """Get `sig` when the parent process dies, even by SIGKILL (Linux's parent-death signal)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def die_with_parent() -> None:
    """In a launcher's child: get SIGTERM when the launcher dies, so nothing is left behind, and exit at once if
    it is already gone. A no-op when PARENT_PID_ENV is unset (not started by a launcher)."""
    parent = os.environ.pop(PARENT_PID_ENV, "")
    if not parent:
        return
    exit_with_parent()
    if os.getppid() != int(parent):  # NOTE: it died before the signal was armed
        sys.exit(1)
