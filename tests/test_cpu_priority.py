"""Background work yields the cores where the kernel shares them between sessions first (autogroup): a
background worker's session is niced, and so is the session of a server it starts; the dashboard's stay at 0.
Each test runs real processes in sessions of their own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from kvlab import cpu_priority
from kvlab.cpu_priority import BACKGROUND_NICENESS, session_niceness, set_session_niceness
from kvlab.experiments import launcher
from tests.host_limits import NO_SESSION_GROUPS, could_not_run, new_sessions_grouped
from tests.waiting import SAFETY_S

#: Where the kernel puts no new session in a group of its own, niceness alone orders the processes: the tests
#: check each process's own niceness and name the session checks this host could not run.
NEW_SESSIONS = new_sessions_grouped()
#: This session's niceness as a new session's niceness is set from it: 0 where it is in no group.
OWN_SESSION = session_niceness() or 0


def _sessions_unchecked(check: str) -> None:
    could_not_run(check, NO_SESSION_GROUPS)


#: Waits until the file argv[2] exists (once its launcher has returned), then starts a server as a launched
#: engine does (ManagedServer: a session of its own), prints its own session's niceness, the server's (None
#: without autogroup) and the server process's own, and stops it.
START_A_SERVER = """
import os, sys, time
from pathlib import Path
from kvlab.cpu_priority import session_niceness
from kvlab.engines.managed_server import ManagedServer
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
server = ManagedServer([sys.executable, "-c", "import time; time.sleep(600)"], "http://127.0.0.1:9/health",
                       Path(sys.argv[1]))
server.start()
try:
    print(session_niceness(), session_niceness(server.pid), os.getpriority(os.PRIO_PROCESS, server.pid),
          flush=True)
finally:
    server.stop()
"""


def _run(command: list[str], tmp_path) -> list[str]:
    go = tmp_path / "go"
    go.touch()
    result = subprocess.run([*command, sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log"), str(go)],
                            capture_output=True, text=True, timeout=SAFETY_S, check=True)
    return result.stdout.split()


def test_a_background_workers_server_runs_in_a_session_as_nice_as_the_workers(tmp_path):
    log, go = tmp_path / "detached.log", tmp_path / "go"
    process = launcher.start_detached([sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log"), str(go)],
                                      log)
    go.touch()  # the launcher has set the session's niceness by now
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join(SAFETY_S)
    assert process.returncode == 0, log.read_text()
    worker_session, server_session, server = log.read_text().split()
    assert int(server) == min(19, os.nice(0) + BACKGROUND_NICENESS)  # the server inherits the worker's niceness
    if NEW_SESSIONS:
        assert [worker_session, server_session] == [str(BACKGROUND_NICENESS)] * 2
    else:
        assert [worker_session, server_session] == ["None"] * 2
        _sessions_unchecked("a background worker's server's session niceness")


def test_a_niced_process_passes_its_own_niceness_to_its_servers_session(tmp_path):
    """`nice -n 10 kvlab worker` in a terminal (a session at 0), or a detached worker before its launcher
    has set its session: the server yields as the process that started it."""
    own_session, server_session, server = _run([shutil.which("nice") or "nice", "-n", str(BACKGROUND_NICENESS)],
                                               tmp_path)
    niced = min(19, os.nice(0) + BACKGROUND_NICENESS)
    assert server == str(niced)
    assert own_session == str(session_niceness())  # `nice` runs in this session
    if NEW_SESSIONS:
        assert server_session == str(max(niced, OWN_SESSION))
    else:
        _sessions_unchecked("a niced process's server's session niceness")


def test_a_server_the_dashboard_starts_keeps_a_session_at_niceness_0(tmp_path):
    """The dashboard's own servers (the playground's `kvlab serve`) are what the user waits for: not niced."""
    own_session, server_session, server = _run([], tmp_path)
    assert server == str(os.nice(0))  # its starter's niceness: 0 under a dashboard started as usual
    assert own_session == str(session_niceness())
    if NEW_SESSIONS:  # a new session starts at 0 and takes its starter's niceness only where that is above 0
        assert server_session == str(max(os.nice(0), OWN_SESSION))
    else:
        _sessions_unchecked("a dashboard server's session niceness")


def test_without_a_session_to_read_or_set_nothing_is_raised():
    """A kernel without autogroup has no /proc/PID/autogroup: as for a process gone, niceness alone counts."""
    gone = 2**22 + 1  # above the kernel's pid_max default: never a live process
    assert session_niceness(gone) is None
    set_session_niceness(gone, BACKGROUND_NICENESS)  # no error: left as it is


def test_a_process_in_no_session_group_reads_as_none(tmp_path, monkeypatch):
    """Where the kernel has autogroup but this process is in none (turned off when its session began), the
    kernel's file is empty: no session niceness, as for a kernel without it (what CI's kernel showed)."""
    empty = tmp_path / "autogroup"
    empty.write_text("")
    monkeypatch.setattr(cpu_priority, "_autogroup", lambda pid: empty)
    assert session_niceness() is None
