"""Checks this host could not run, and why: said in the test run's summary, never skipped in silence.

A test that runs another branch because the host lacks a capability (vLLM's fp8 KV cache on a CPU without
AVX-512 or AMX) calls :func:`could_not_run`; ``tests/conftest.py`` prints the list at the end of the run.
"""

from __future__ import annotations

import functools
import subprocess
import sys

from tests.waiting import SAFETY_S

COULD_NOT_RUN: dict[str, str] = {}


def could_not_run(check: str, why: str) -> None:
    """Record that this host could not run ``check`` because ``why`` (each check once)."""
    COULD_NOT_RUN.setdefault(check, why)


#: Why a session check could not run (:func:`new_sessions_grouped` False).
NO_SESSION_GROUPS = "this kernel puts no new session in a group of its own (no autogroup): niceness alone orders the " \
                    "processes"


@functools.cache
def new_sessions_grouped() -> bool:
    """Whether the kernel puts a new session in a scheduling group of its own (autogroup), as it does for a detached
    worker and for each server started in a session of its own.  Read from a real new session, not from this
    one's: CI's kernel left the test run's own session in no group (its /proc/PID/autogroup empty) yet grouped
    each new session."""
    probe = "import os; os.setsid(); from kvlab.cpu_priority import session_niceness as s; print(s())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            timeout=SAFETY_S)
    return result.stdout.split() != ["None"]
