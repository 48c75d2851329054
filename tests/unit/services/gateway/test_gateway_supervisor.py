"""The supervisor's housekeeping: metrics directories left by supervisors that were killed outright go."""

import os
import subprocess

from services.gateway.supervisor import METRICS_DIR_PREFIX, remove_orphaned_metrics_dirs


def test_metrics_dirs_of_dead_supervisors_are_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer exists
    dead = tmp_path / f"{METRICS_DIR_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{METRICS_DIR_PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for path in (dead, live, other):
        path.mkdir()
        (path / "counter_1.db").write_bytes(b"x")
    assert remove_orphaned_metrics_dirs(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and other.exists()
