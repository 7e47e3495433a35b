"""The tail of the log of the workers that ran an experiment, as the experiment page shows it.

Local workers (``kvlab run --background``, reruns, the dashboard's launches) write to
``worker-<launcher pid>-<n>.log`` in :func:`kvlab.paths.log_dir` (:mod:`kvlab.experiments.launcher`); one
file holds every worker its launcher started there in turn, each beginning with the worker's first
line, ``kvlab.experiments.worker INFO worker <worker id> on <store>``.  An experiment's trials name
their workers (``TrialRecord.worker_id``), so its log is the sections of those workers, found in the
files written since the experiment was created.  Workers on other hosts (and ``kvlab run`` in a
terminal, and Ray's) log where they run: there is no file here to read then, and the tail says so.

Every line passes through :func:`kvlab.secrets.redact` before it is returned.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from kvlab.paths import log_dir
from kvlab.secrets import redact

#: The lines of a tail.
TAIL_LINES = 50
WORKER_LOGS = "worker-*.log"
#: A worker's first line (``Worker.run``), under the format of ``kvlab worker``'s logging.
_HEADER = re.compile(r" kvlab\.experiments\.worker INFO worker (?P<worker>\S+) on ")
#: A line's time as ``kvlab worker``'s logging writes it (``2026-01-31 12:00:00,123``): sorts as text.
_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
_STAMP_CHARS = 23


@dataclass(frozen=True)
class LogTail:
    """The last lines of the sections of an experiment's workers, oldest first, and the files read."""

    lines: list[str]
    files: list[Path]


def worker_sections(text: str) -> dict[str, list[str]]:
    """A worker log's lines by the worker that wrote them (lines before any worker's first line: none)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = _HEADER.search(line)
        if header is not None:
            current = sections.setdefault(header["worker"], [])
        if current is not None:
            current.append(line)
    return sections


def worker_log_tail(worker_ids: Collection[str], since: float, lines: int = TAIL_LINES,
                    folder: Path | None = None) -> LogTail:
    """The last ``lines`` lines the workers ``worker_ids`` wrote to the worker logs in ``folder``
    (default :func:`~kvlab.paths.log_dir`) modified at or after ``since`` (unix seconds: the
    experiment's creation), redacted; files in the order they were last written."""
    wanted = set(worker_ids)
    folder = folder or log_dir()
    if not wanted or not folder.is_dir():
        return LogTail([], [])
    files = []
    for path in folder.glob(WORKER_LOGS):
        try:
            modified = path.stat().st_mtime
        except OSError:  # removed meanwhile
            continue
        if modified >= since:
            files.append((modified, path))
    stamped: list[tuple[str, int, str]] = []  # (the time of the line or of the last stamped one before it, order, line)
    read = []
    for _, path in sorted(files):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        mine = [rows for worker, rows in worker_sections(text).items() if worker in wanted]
        if mine:
            read.append(path)
        for rows in mine:
            stamp = ""
            for line in rows:
                stamp = line[:_STAMP_CHARS] if _STAMP.match(line) else stamp
                stamped.append((stamp, len(stamped), line))
    tail: deque[str] = deque((line for _, _, line in sorted(stamped)), maxlen=lines)  # workers ran in parallel
    return LogTail([redact(line) for line in tail], read)
