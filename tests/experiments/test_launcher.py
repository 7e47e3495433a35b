"""Local workers started for the dashboard are reaped when they end: a child nobody waits for stays a
zombie under the long-lived server (and whoever waits for it to disappear waits forever)."""

from __future__ import annotations

import os
import sys
import threading

import psutil

from kvlab.cpu_priority import BACKGROUND_NICENESS, session_niceness
from kvlab.experiments import launcher
from tests.host_limits import NO_SESSION_GROUPS, could_not_run, new_sessions_grouped
from tests.waiting import wait_until

#: Says it has started (its file, argv[1]: `nice` has set its niceness and run it by then), then sleeps.
SLEEPER = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(600)"


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


def test_each_detached_process_leads_a_session_run_at_the_background_niceness(tmp_path):
    """With autogroup scheduling the CPU is shared between sessions before niceness counts: each detached
    session is niced too, several started at once included (the kernel takes one such change per 100 ms).
    Where the kernel puts no new session in a group, each still leads its own, at its own niceness."""
    started = [tmp_path / f"{i}.started" for i in range(3)]
    processes = [launcher.start_detached([sys.executable, "-c", SLEEPER, str(started[i])], tmp_path / f"{i}.log")
                 for i in range(3)]
    try:
        for index, (process, file) in enumerate(zip(processes, started, strict=True)):
            wait_until(file.exists, f"detached process {index} to start", process=process)  # past `nice`: its own
        sessions = [os.getsid(p.pid) for p in processes]
        assert sessions == [p.pid for p in processes]  # a session each, none the test's own
        assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in processes] == [
            min(19, os.nice(0) + BACKGROUND_NICENESS)] * 3
        if not new_sessions_grouped():
            could_not_run("detached sessions' niceness", NO_SESSION_GROUPS)
        else:
            assert [session_niceness(p.pid) for p in processes] == [BACKGROUND_NICENESS] * 3
    finally:
        for process in processes:
            process.kill()
            process.wait()
