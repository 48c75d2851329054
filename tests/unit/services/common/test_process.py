"""The shared restart policy and parent-death handling: exits counted in a sliding window, a crash loop past the
limit, and a child that exits at once when the launcher that named it is already gone."""

import os
import subprocess
import sys
from pathlib import Path

from services.common.process import PARENT_PID_ENV, ExitWindow, RestartPolicy

ROOT = Path(__file__).resolve().parents[4]


def test_exits_leave_the_window_as_it_slides():
    window = ExitWindow()
    assert [window.record(t, 60.0) for t in (0.0, 10.0, 59.0)] == [1, 2, 3]
    assert window.record(61.0, 60.0) == 3  # the exit at 0 s has left
    assert window.recent(130.0, 60.0) == 0


def test_more_exits_than_allowed_in_the_window_is_a_crash_loop():
    policy = RestartPolicy()  # the "5 exits in 60 s" both launchers use
    assert (policy.max_restarts, policy.window_s) == (5, 60.0)
    assert not policy.is_crash_loop(5) and policy.is_crash_loop(6)


def _child(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "from services.common.process import die_with_parent; die_with_parent(); print('alive')"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def test_a_child_of_a_live_parent_lives_and_a_child_of_a_gone_one_exits():
    assert _child({PARENT_PID_ENV: str(os.getpid())}).stdout.strip() == "alive"
    orphan = _child({PARENT_PID_ENV: "1"})  # NOTE: not this child's parent: as if the launcher died before
    assert orphan.returncode == 1 and orphan.stdout == ""


def test_outside_a_launcher_it_is_a_no_op():
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from services.common.process import die_with_parent; die_with_parent(); print('alive')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip() == "alive"
