"""Background work yields the cores where the kernel shares them between sessions first (autogroup): a
background worker's session is niced, and so is the session of a server it starts; the dashboard's stay at 0.
Each test runs real processes in sessions of their own."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from kvlab.cpu_priority import BACKGROUND_NICENESS, session_niceness
from kvlab.experiments import launcher
from tests.waiting import SAFETY_S

pytestmark = pytest.mark.skipif(session_niceness() is None, reason="this kernel has no autogroup scheduling: "
                                "niceness alone orders the processes")

#: Starts a server as a launched engine does (ManagedServer: a session of its own), prints its own
#: session's niceness and the server's, and stops it.
START_A_SERVER = """
import sys
from pathlib import Path
from kvlab.cpu_priority import session_niceness
from kvlab.engines.managed_server import ManagedServer
server = ManagedServer([sys.executable, "-c", "import time; time.sleep(600)"], "http://127.0.0.1:9/health",
                       Path(sys.argv[1]))
server.start()
try:
    print(session_niceness(), session_niceness(server.pid), flush=True)
finally:
    server.stop()
"""


def test_a_background_workers_server_runs_in_a_session_as_nice_as_the_workers(tmp_path):
    log = tmp_path / "detached.log"
    process = launcher.start_detached([sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log")], log)
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join(SAFETY_S)
    assert process.returncode == 0, log.read_text()
    assert log.read_text().split() == [str(BACKGROUND_NICENESS)] * 2


def test_a_server_the_dashboard_starts_keeps_a_session_at_niceness_0(tmp_path):
    own = session_niceness()
    if own:
        pytest.skip(f"this test runs in a session at niceness {own}")
    result = subprocess.run([sys.executable, "-c", START_A_SERVER, str(tmp_path / "server.log")],
                            capture_output=True, text=True, timeout=SAFETY_S, check=True)
    assert result.stdout.split() == ["0", "0"]
