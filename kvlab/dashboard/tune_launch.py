"""Finding the tune that the new-experiment page's Tune mode started in the background: ``kvlab tune``
loads the model before it stores its experiment, so the page polls the store for it (and, when it
never appears, shows the last line of the process's log, where a failed ``kvlab tune`` says why).
"""

from __future__ import annotations

import time
from pathlib import Path

from kvlab.store import Store

#: How long Launch waits for the background ``kvlab tune`` to store its experiment (it loads the model first).
APPEAR_TIMEOUT_S = 90.0


def wait_for_tune(store: Store, name: str, after_id: int, timeout_s: float, poll_s: float = 1.0) -> int | None:
    """The id of the first tune named ``name`` stored after experiment ``after_id``, or None by the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e.id for e in store.list_experiments(search=name, limit=20)
                 if e.id > after_id and e.name == name and e.spec.get("tune") is not None]
        if found:
            return min(found)
        if time.monotonic() > deadline:
            return None
        time.sleep(poll_s)


def last_line(log: Path) -> str:
    """The log's last line (a ``kvlab tune`` that failed says why there), or that it is empty."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1][:300] if lines else "its log is empty"
