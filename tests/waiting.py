"""Waiting in tests: on an event (a line printed, a row written, a process state), never on a budget.

A budget sized for an idle machine fails on a busy one (the suite runs on laptops doing other work,
at load 4 and more, where a model loads in a minute instead of ten seconds).  Every wait here ends
as soon as its event happens; :data:`SAFETY_S` only caps it, so that a hang fails its test with a
message instead of stalling the suite.  Use it for the ``timeout=`` of ``subprocess.run``,
``Popen.wait`` and ``communicate`` too.  Where a duration is itself the behaviour under test (a
request timeout, a startup deadline), the test keeps its own figure.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

#: Seconds after which a wait is a hang: far beyond the slowest event of the suite on a busy machine.
SAFETY_S = 900.0

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, *, process: subprocess.Popen | None = None,
               poll_s: float = 0.05) -> T:
    """The first true value of ``condition()``, polled every ``poll_s``.

    Fails naming ``what`` after :data:`SAFETY_S`, or at once when ``process`` (the one expected to
    bring the event about) has exited before it happened.
    """
    deadline = time.monotonic() + SAFETY_S
    while True:
        exited = process.poll() if process is not None else None
        value = condition()
        if value:
            return value
        if exited is not None:
            raise AssertionError(f"the process exited (status {exited}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {SAFETY_S:.0f} s waiting for {what}")
        time.sleep(poll_s)
