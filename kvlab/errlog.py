"""Where the details of an unexpected error go, so that users see one line and never a traceback.

The CLI and the dashboard append the full traceback to ``kvlab-<name>.log`` in :func:`kvlab.paths.log_dir`
(``$KVLAB_LOG_DIR``, else ``$KVLAB_HOME/logs``, default ``~/.cache/kvlab/logs/``; kept under 1 MiB with one
rotated copy ``.log.1``), and tell the user that path.  When that directory cannot be written, the log goes
to the system's temporary directory instead.  Everything written or shown passes through
:func:`kvlab.secrets.redact`.  ``KVLAB_DEBUG=1`` makes both re-raise instead, showing the traceback.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from datetime import datetime
from pathlib import Path

from kvlab.paths import log_dir
from kvlab.secrets import redact  # URL credentials and known secret values out of every line

LOG_MAX_BYTES = 1 << 20
LINE_LIMIT = 300


def debug_enabled() -> bool:
    """``KVLAB_DEBUG`` set to anything but empty, 0, false or no."""
    return os.environ.get("KVLAB_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` on one line: its lines joined with "; ", redacted (before the cut, which could leave
    half a secret that no longer matches), cut at ``limit`` characters."""
    joined = redact("; ".join(line.strip() for line in str(text).splitlines() if line.strip()))
    return joined if len(joined) <= limit else joined[:limit - 3].rstrip() + "..."


def log_details(name: str, context: str, error: BaseException | None = None, text: str | None = None) -> Path:
    """Append a timestamp, ``context`` and the traceback of ``error`` (or ``text``) to the log ``name``;
    returns its path (``os.devnull`` when no directory can be written)."""
    body = "".join(traceback.format_exception(error)) if error is not None else (text or "")
    entry = redact(f"{datetime.now().astimezone():%Y-%m-%d %H:%M:%S%z} {context}\n{body}".rstrip()) + "\n\n"
    for directory in (log_dir(), Path(tempfile.gettempdir())):
        path = directory / f"kvlab-{name}.log"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if path.is_file() and path.stat().st_size > LOG_MAX_BYTES:
                path.replace(path.with_name(path.name + ".1"))
            with path.open("a", encoding="utf-8") as log:
                log.write(entry)
        except OSError:
            continue
        return path
    return Path(os.devnull)
