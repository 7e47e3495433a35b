"""Start local worker processes (for `kvlab run --background` and the dashboard)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


LOG_DIR_VAR = "KVLAB_LOG_DIR"


def worker_log_dir() -> Path:
    """Where local workers write their logs: ``$KVLAB_LOG_DIR``, else ``db/logs`` in the checkout."""
    return Path(os.environ.get(LOG_DIR_VAR) or Path(__file__).resolve().parent.parent / "db" / "logs")


def threads_per_worker(workers: int) -> int:
    """Split the cores: torch threads of several processes spin against each other otherwise
    (measured here: a 320-token prefill took 7.2 s instead of 0.7 s with one competing process)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def start_local_workers(count: int, log_dir: Path, database_url: str | None = None, exit_when_idle: bool = True,
                        extra_args: list[str] | None = None) -> list[subprocess.Popen]:
    """Start ``count`` detached ``kvlab worker`` processes on ``database_url`` (default: the
    ``KVLAB_DATABASE_URL`` environment variable, else the SQLite file in db/).

    They outlive the caller (a closed terminal or browser tab) and log to ``log_dir``.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if database_url:
        env["KVLAB_DATABASE_URL"] = database_url
    processes = []
    for index in range(count):
        args = [sys.executable, "-m", "kvlab.cli", "worker", "--threads", str(threads_per_worker(count))]
        args += ["--exit-when-idle"] if exit_when_idle else []
        args += extra_args or []
        log = open(log_dir / f"worker-{os.getpid()}-{index}.log", "ab")  # noqa: SIM115 -- owned by the child
        processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True))
    return processes
