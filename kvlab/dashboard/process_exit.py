"""What the dashboard's process started and must stop when it ends, however it ends.

The dashboard starts processes of its own: the playground's ``kvlab serve`` (in its own session, so that a
Ctrl-C in the terminal reaches the dashboard only) and the export renderer's Chromium.  ``atexit`` stops them
at a normal exit, but served as an ``st.App`` (app.py) uvicorn answers SIGTERM with a graceful shutdown and
then raises the signal again, so that the exit status says it: the process ends by the signal, and ``atexit``
never runs (measured: exit status -15 and the playground's server left running).  The app's lifespan calls
:func:`stop_all` after that shutdown; ``atexit`` calls it at any other exit.  Each cleanup runs once.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

_cleanups: list[Callable[[], None]] = []
_lock = threading.Lock()


def stop_at_exit(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` when the process ends (once, by :func:`stop_all`)."""
    with _lock:
        _cleanups.append(cleanup)


def stop_all() -> None:
    """Run every registered cleanup, the latest first; one that fails is logged and the others still run."""
    while True:
        with _lock:
            if not _cleanups:
                return
            cleanup = _cleanups.pop()
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - the process is ending: log it and stop the others
            logging.getLogger(__name__).exception("stopping %r at exit failed", cleanup)


atexit.register(stop_all)
