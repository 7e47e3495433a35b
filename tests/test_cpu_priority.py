"""Background work yields the cores where the kernel shares them between sessions first (autogroup): a
background worker's session is niced, and so is the session of a server it starts; the dashboard's stay at 0.
Each test runs real processes in sessions of their own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading

import pytest

from kvlab.cpu_priority import BACKGROUND_NICENESS, session_niceness, set_session_niceness
from kvlab.experiments import launcher
from tests.waiting import SAFETY_S

autogroup = pytest.mark.skipif(session_niceness() is None, reason="this kernel has no autogroup scheduling: "
                               "niceness alone orders the processes")

#: Waits until the file argv[2] exists (once its launcher has returned), then starts a server as a launched
#: engine does (ManagedServer: a session of its own), prints its own session's niceness and the server's, and
#: stops it.
START_A_SERVER = """
import sys, time
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
    print(session_niceness(), session_niceness(server.pid), flush=True)
finally:
    server.stop()
"""


def _run(command: list[str], tmp_path) -> list[str]:
    go = tmp_path / "go"
    go.touch()
    result = subprocess.run([*command, sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log"), str(go)],
                            capture_output=True, text=True, timeout=SAFETY_S, check=True)
    return result.stdout.split()


@autogroup
def test_a_background_workers_server_runs_in_a_session_as_nice_as_the_workers(tmp_path):
    log, go = tmp_path / "detached.log", tmp_path / "go"
    process = launcher.start_detached([sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log"), str(go)],
                                      log)
    go.touch()  # the launcher has set the session's niceness by now
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join(SAFETY_S)
    assert process.returncode == 0, log.read_text()
    assert log.read_text().split() == [str(BACKGROUND_NICENESS)] * 2


@autogroup
def test_a_niced_process_passes_its_own_niceness_to_its_servers_session(tmp_path):
    """`nice -n 10 kvlab worker` in a terminal (a session at 0), or a detached worker before its launcher
    has set its session: the server yields as the process that started it."""
    if session_niceness():
        pytest.skip("this test runs in a niced session")
    assert _run([shutil.which("nice") or "nice", "-n", str(BACKGROUND_NICENESS)], tmp_path) == [
        "0", str(BACKGROUND_NICENESS)]


@autogroup
def test_a_server_the_dashboard_starts_keeps_a_session_at_niceness_0(tmp_path):
    """The dashboard's own servers (the playground's `kvlab serve`) are what the user waits for: not niced."""
    if session_niceness():
        pytest.skip("this test runs in a niced session")
    assert _run([], tmp_path) == ["0", "0"]


def test_without_a_session_to_read_or_set_nothing_is_raised():
    """A kernel without autogroup has no /proc/PID/autogroup: as for a process gone, niceness alone counts."""
    gone = 2**22 + 1  # above the kernel's pid_max default: never a live process
    assert session_niceness(gone) is None
    set_session_niceness(gone, BACKGROUND_NICENESS)  # no error: left as it is
