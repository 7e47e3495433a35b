"""Local workers started for the dashboard are reaped when they end: a child nobody waits for stays a
zombie under the long-lived server (and whoever waits for it to disappear waits forever)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import psutil
import pytest

from kvlab.cpu_priority import BACKGROUND_NICENESS
from kvlab.experiments import launcher


def test_a_local_worker_that_ends_is_reaped(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    [process] = launcher.start_local_workers(1)  # an empty store: it exits as soon as it is idle
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join()  # returns once the process has ended and been waited for
    assert process.returncode == 0, [log.read_text() for log in (tmp_path / "logs").iterdir()]
    assert not psutil.pid_exists(process.pid)  # no zombie left under this process


def test_a_detached_process_runs_at_the_background_niceness(tmp_path):
    """Background work yields the cores to the dashboard and the playground's server (nice 0)."""
    log = tmp_path / "nice.log"
    process = launcher.start_detached([sys.executable, "-c", "import os; print(os.nice(0))"], log)
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join()
    assert process.returncode == 0, log.read_text()
    assert int(log.read_text()) == min(19, os.nice(0) + BACKGROUND_NICENESS)


def test_detached_sessions_run_at_the_background_niceness_where_the_kernel_groups_by_session(tmp_path):
    """With autogroup scheduling the CPU is shared between sessions before niceness counts: each detached
    session is niced too, several started at once included (the kernel takes one such change per 100 ms)."""
    if not Path(f"/proc/{os.getpid()}/autogroup").exists():
        pytest.skip("this kernel has no autogroup scheduling: niceness alone orders the processes")
    processes = [launcher.start_detached([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / f"{i}.log")
                 for i in range(3)]
    try:
        groups = [Path(f"/proc/{p.pid}/autogroup").read_text().split() for p in processes]
        assert len({group[0] for group in groups}) == 3  # a session each, none the test's own
        assert Path(f"/proc/{os.getpid()}/autogroup").read_text().split()[0] not in {group[0] for group in groups}
        assert [group[-1] for group in groups] == [str(BACKGROUND_NICENESS)] * 3, groups
    finally:
        for process in processes:
            process.kill()
            process.wait()
