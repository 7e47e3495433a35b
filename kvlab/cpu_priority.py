"""The CPU priority of kvlab's background processes: they yield the cores to what a user waits for.

Detached workers and tune drivers (:mod:`kvlab.experiments.launcher`) run at :data:`BACKGROUND_NICENESS`,
and so do the sessions they lead.  Linux's autogroup scheduling (``kernel.sched_autogroup_enabled``, on
by default in Debian's and Ubuntu's kernels) shares the CPU between sessions first and by niceness only
inside each; a detached process leads a session of its own, so its niceness alone gave it as much CPU as
the dashboard's whole session.  Measured on 2 cores (docs/decisions.md, issue 38): a warm page beside a
worker running quick.toml took 2.2-2.6 s at nice 10, 2.07 s with its session niced too, 1.90 s idle.

A server a background process starts in a session of its own (a launched vLLM, :mod:`kvlab.engines.managed_server`)
inherits its niceness but not its session's: :func:`pass_on_session_niceness` gives it that too.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

#: Background work's niceness.  At 10 the scheduler gives a nice-0 process about 9 times a nice-10
#: one's share (CFS weights 1024 and 110).
BACKGROUND_NICENESS = 10
#: An unprivileged process may change a session's niceness once per 100 ms, system-wide (EAGAIN otherwise).
AUTOGROUP_RETRY_S, AUTOGROUP_ATTEMPTS = 0.11, 10
_log = logging.getLogger(__name__)


def _autogroup(pid: int | str) -> Path:
    return Path(f"/proc/{pid}/autogroup")


def session_niceness(pid: int | str = "self") -> int | None:
    """The niceness of the session (autogroup) ``pid`` is in; None where the kernel has no autogroup."""
    try:  # "/autogroup-2629 nice 10"
        return int(_autogroup(pid).read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_session_niceness(pid: int, niceness: int) -> None:
    """Set the niceness of the session ``pid`` leads.  A kernel without autogroup (no such file) or one
    that refuses is left as it is: the process still runs at its own niceness."""
    for _ in range(AUTOGROUP_ATTEMPTS):
        try:
            _autogroup(pid).write_text(str(niceness))
            return
        except BlockingIOError:  # EAGAIN: some session's niceness was set less than 100 ms ago
            time.sleep(AUTOGROUP_RETRY_S)
        except OSError:  # no autogroup, the process already gone, or not allowed
            return
    _log.debug("the session of process %d kept its niceness: the kernel refused %d changes in a row", pid,
               AUTOGROUP_ATTEMPTS)


def pass_on_session_niceness(pid: int) -> None:
    """Give the session ``pid`` leads the niceness this process runs at, its session's or its own, where
    that is above 0: a background worker's server yields as its worker does (its own niceness is set
    before it runs, its session's by its launcher a moment after it starts); the dashboard's stay at 0."""
    own = max(session_niceness() or 0, os.getpriority(os.PRIO_PROCESS, 0))
    if own > 0:
        set_session_niceness(pid, own)
