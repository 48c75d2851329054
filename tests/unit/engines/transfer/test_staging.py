"""Staging files are named by their owner's pid, and a file whose owner died (SIGKILL: no close) is removed when
the next staging file is made."""

import os
import subprocess
import sys

from engines.transfer.staging import StagingFile, owner_pid, remove_orphans


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_staging_file_names_its_owner_and_close_removes_it():
    f = StagingFile(4096, "tandem-kv-import")
    name = os.path.basename(f.path)
    assert owner_pid(name) == os.getpid()
    f.close()
    assert not os.path.exists(f.path)


def test_files_of_dead_owners_go_and_live_ones_stay(tmp_path):
    dead, live = f"tandem-kv-import-{dead_pid()}-abc", f"tandem-kv-export-{os.getpid()}-def"
    other = "tandem-kv-test"  # no pid in its name: not ours to judge
    for name in (dead, live, other):
        (tmp_path / name).write_bytes(b"x")
    assert remove_orphans(str(tmp_path)) == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted([live, other])


def test_owner_pid_reads_only_staging_names():
    assert owner_pid("tandem-kv-import-123-x9_z") == 123
    assert owner_pid("tandem-kv-import-x9_z") is None
    assert owner_pid("sem.mp-123-4") is None
