"""Start detached kvlab processes on this host: local workers (``kvlab run --background``, rerun and the
dashboard's sweeps) and a tune's driver (``kvlab tune --background`` and the dashboard's Tune).  Each
logs to :func:`kvlab.paths.log_dir` and runs at a lower CPU priority, its session too (:mod:`kvlab.cpu_priority`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvlab.cpu_priority import BACKGROUND_NICENESS, set_session_niceness
from kvlab.paths import log_dir
from kvlab.threads import beside_others, share_of_cores

MAX_LOCAL_WORKERS = 64  # what `kvlab run --background --workers` and `kvlab rerun --workers` accept


def start_local_workers(count: int, exit_when_idle: bool = True) -> list[subprocess.Popen]:
    """Start ``count`` detached ``kvlab worker`` processes.

    They work on the store of this process's ``KVLAB_DATABASE_URL`` (inherited; else the SQLite
    file in db/), outlive the caller (a closed terminal or browser tab) and log to :func:`kvlab.paths.log_dir`.
    """
    folder = log_dir()
    processes = []
    for index in range(count):
        args = [sys.executable, "-m", "kvlab.cli", "worker", "--threads", str(share_of_cores(count))]
        args += ["--exit-when-idle"] if exit_when_idle else []
        processes.append(start_detached(args, folder / f"worker-{os.getpid()}-{index}.log"))
    return processes


@dataclass(frozen=True)
class BackgroundTune:
    """A ``kvlab tune`` started by :func:`start_tune_driver`: its process and its log file."""

    process: subprocess.Popen[bytes]
    log: Path


def start_tune_driver(args: Sequence[str]) -> BackgroundTune:
    """Start ``kvlab tune ARGS`` detached (``--drive ID``: the tune a submit stored; ``--resume ID``),
    logging to a ``tune-*.log`` of its own."""
    log = log_dir() / f"tune-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    return BackgroundTune(start_detached([sys.executable, "-m", "kvlab.cli", "tune", *args], log), log)


def start_detached(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a kvlab process in its own session (a closed terminal or Ctrl-C does not reach it), at
    :data:`BACKGROUND_NICENESS`, its threads sleeping when idle (:func:`kvlab.threads.beside_others`: it runs
    beside the dashboard or other workers), writing to ``log`` (its folder made if missing), and reap it when it
    ends.

    A thread of this process waits for it: the dashboard's server lives on, and a child nobody waits
    for stays a zombie under it (and whoever waits for it to disappear waits forever).  When this
    process ends first, the child outlives it and init reaps it.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    nice = shutil.which("nice")  # POSIX's: it execs the command, so the process is the command's own
    command = [nice, "-n", str(BACKGROUND_NICENESS), *args] if nice else list(args)
    with open(log, "ab") as handle:  # the child keeps its own copy
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=os.environ | beside_others())
    set_session_niceness(process.pid, BACKGROUND_NICENESS)  # Popen returns after the exec: its session exists
    threading.Thread(target=process.wait, name=f"kvlab-{process.pid}-reaper", daemon=True).start()
    return process
