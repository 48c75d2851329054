"""`tandem up`'s supervisor: a child that exits is started again after a backoff, as compose's `restart:
unless-stopped` or a Kubernetes restart policy would, while the rest of the stack keeps serving. It gives up only
on a crash loop (too many exits in a window) or on exit code 2 (bad settings: a restart cannot help), naming the
child and why.

RestartPolicy (services/common/process.py) is pure (times in, decisions out); Supervisor polls processes through
the callables it is given.
"""

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.process import ExitWindow, RestartPolicy

log = logging.getLogger(__name__)
BAD_SETTINGS_EXIT = 2  # every tandem service exits 2 on a bad setting


class CrashLoopError(RuntimeError):
    """A child will not stay up; the message says which one and why."""


@dataclass(slots=True)
class History:
    """One child's exits, and when it is due to start again."""

    window: ExitWindow = field(default_factory=ExitWindow)
    restart_at: float | None = None
    num_restarts: int = 0


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


class Supervisor:
    """Watches the children `names()` lists (the set may change) through `exit_code(name)` (None while it runs)
    and starts one again with `restart(name)`; `poll()` does one round and raises CrashLoopError when it must
    give up."""

    def __init__(
        self,
        names: Callable[[], list[str]],
        exit_code: Callable[[str], int | None],
        restart: Callable[[str], None],
        log_tail: Callable[[str], str] = lambda name: "",
        policy: RestartPolicy = RestartPolicy(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.policy = policy
        self._names, self._exit_code, self._restart = names, exit_code, restart
        self._log_tail, self._clock = log_tail, clock
        self.histories: dict[str, History] = {}

    def poll(self) -> None:
        now = self._clock()
        for name in self._names():
            history = self.histories.setdefault(name, History())
            if history.restart_at is None:
                code = self._exit_code(name)
                if code is not None:
                    self._on_exit(name, code, history, now)
            elif now >= history.restart_at:
                history.restart_at = None
                history.num_restarts += 1
                self._restart(name)
                log.warning("%s started again (restart %d)", name, history.num_restarts)

    def _on_exit(self, name: str, code: int, history: History, now: float) -> None:
        how = describe_exit(code)
        if code == BAD_SETTINGS_EXIT:
            raise CrashLoopError(f"{name} exited with {how} (bad settings; a restart would not help){self._tail(name)}")
        num_recent = history.window.record(now, self.policy.window_s)
        if self.policy.is_crash_loop(num_recent):
            raise CrashLoopError(
                f"{name} is crash-looping: it exited {num_recent} times within "
                f"{self.policy.window_s:.0f} s, the last with {how}{self._tail(name)}"
            )
        wait_s = self.policy.backoff_s(num_recent)
        history.restart_at = now + wait_s
        log.warning(
            "%s exited with %s; starting it again in %.1f s (%d of %d restarts allowed in %.0f s)",
            name,
            how,
            wait_s,
            num_recent,
            self.policy.max_restarts,
            self.policy.window_s,
        )

    def _tail(self, name: str) -> str:
        tail = self._log_tail(name).strip()
        return f"; its log ends:\n{tail}" if tail else ""
