"""Local workers started for the dashboard are reaped when they end: a child nobody waits for stays a
zombie under the long-lived server (and whoever waits for it to disappear waits forever)."""

from __future__ import annotations

import threading

import psutil

from kvlab.experiments import launcher


def test_a_local_worker_that_ends_is_reaped(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    monkeypatch.setenv("KVLAB_LOG_DIR", str(tmp_path / "logs"))
    [process] = launcher.start_local_workers(1)  # an empty store: it exits as soon as it is idle
    [reaper] = [t for t in threading.enumerate() if t.name == f"kvlab-{process.pid}-reaper"]
    reaper.join()  # returns once the process has ended and been waited for
    assert process.returncode == 0, [log.read_text() for log in (tmp_path / "logs").iterdir()]
    assert not psutil.pid_exists(process.pid)  # no zombie left under this process
