"""What a tune launched from the dashboard carries: an event saying so, with its process's log
(:data:`LAUNCH_EVENT`, recorded by :func:`kvlab.dashboard.launch.launch_tune`), which the tune page reads.

:func:`wait_for_tune`, :data:`APPEAR_TIMEOUT_S` and :func:`last_line` serve the page's launch until it
calls :func:`kvlab.dashboard.launch.launch_tune` (issue 20): then delete them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kvlab.store import Store

#: How long Launch waits for the background ``kvlab tune`` to store its experiment (it loads the model first).
APPEAR_TIMEOUT_S = 90.0
#: The event a tune launched from the dashboard carries (its origin: ``kvlab tune`` records the rest).
LAUNCH_EVENT = "launched from the dashboard (New experiment, mode Tune)"


def wait_for_tune(store: Store, name: str, after_id: int, timeout_s: float, poll_s: float = 1.0,
                  ended: Callable[[], bool] = lambda: False) -> int | None:
    """The id of the first tune named ``name`` stored after experiment ``after_id`` with its search
    recorded (``kvlab tune`` stores the experiment, then the search), or None by the timeout or once
    the process has ``ended`` without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        was_over = ended()
        found = [e.id for e in store.list_experiments(search=name, limit=20)
                 if e.id > after_id and e.name == name and e.spec.get("tune") is not None
                 and store.tune(e.id) is not None]
        if found:
            return min(found)
        if was_over or time.monotonic() > deadline:
            return None
        time.sleep(poll_s)


def record_launch(store: Store, experiment_id: int, log: Path) -> None:
    store.log_event(experiment_id, f"{LAUNCH_EVENT}; the process's log: {log}")


def launched_here(store: Store, experiment_id: int) -> bool:
    """Whether the dashboard launched this tune (else ``kvlab tune`` in a terminal, or a script)."""
    return any(event.message.startswith(LAUNCH_EVENT) for event in store.events(experiment_id))


def last_line(log: Path) -> str:
    """The log's last line (a ``kvlab tune`` that failed says why there), or that it is empty."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1][:300] if lines else "its log is empty"
