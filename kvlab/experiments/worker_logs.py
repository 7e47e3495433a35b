"""The tail of the log of the workers that ran an experiment, as the experiment page shows it.

Local workers (``kvlab run --background``, reruns, the dashboard's launches) write to
``worker-<launcher pid>-<n>.log`` in :func:`kvlab.paths.log_dir` (:mod:`kvlab.experiments.launcher`); one
file holds every worker its launcher started there in turn, each beginning with the worker's first
line, ``kvlab.experiments.worker INFO worker <worker id> on <store>``.  An experiment's trials name
their workers (``TrialRecord.worker_id``), so its log is the sections of those workers, found in the
files written since the experiment was created.  Workers on other hosts (and ``kvlab run`` in a
terminal, and Ray's) log where they run: there is no file here to read then, and the tail says so.

Every line passes through :func:`kvlab.secrets.redact` before it is returned.  A worker's log grows as long as
it runs and the page reads it every few seconds, so only the last :data:`TAIL_BYTES` of a file are read each
time; which worker wrote that window's first lines comes from one scan of what came before, continued where
the last read stopped (:class:`_Prefix`), so each byte is read once per dashboard process.
"""

from __future__ import annotations

import re
import threading
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
#: The most of a log file read for its tail (a tail of 50 lines needs far less; this spares a long log).
TAIL_BYTES = 1 << 20


@dataclass(frozen=True)
class LogTail:
    """The last lines of the sections of an experiment's workers, oldest first, and the files read."""

    lines: list[str]
    files: list[Path]


def worker_sections(text: str, writing: str | None = None) -> dict[str, list[str]]:
    """A worker log's lines by the worker that wrote them; lines before any worker's first line are
    ``writing``'s (the worker whose first line came before ``text``), else nobody's."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None if writing is None else sections.setdefault(writing, [])
    for line in text.splitlines():
        header = _HEADER.search(line)
        if header is not None:
            current = sections.setdefault(header["worker"], [])
        if current is not None:
            current.append(line)
    return sections


@dataclass
class _Prefix:
    """How far a file was scanned for workers' first lines, and the last worker found there."""

    inode: int
    scanned: int = 0
    last: str | None = None


_prefixes: dict[Path, _Prefix] = {}
_prefixes_lock = threading.Lock()  # the page's sessions run in threads of one process


def _writer_before(path: Path, inode: int, offset: int) -> str | None:
    """The worker whose first line is the last one before byte ``offset`` (a line's start) of ``path``."""
    with _prefixes_lock:
        prefix = _prefixes.get(path)
        if prefix is None or prefix.inode != inode or prefix.scanned > offset:  # a new file, or rewritten
            prefix = _prefixes[path] = _Prefix(inode)
        with path.open("rb") as handle:
            handle.seek(prefix.scanned)
            while prefix.scanned < offset:
                chunk = handle.read(min(TAIL_BYTES, offset - prefix.scanned))
                if not chunk:
                    break
                whole = chunk[:chunk.rfind(b"\n") + 1] if len(chunk) < offset - prefix.scanned else chunk
                if not whole:  # one line longer than a chunk: read on to its end
                    whole = chunk + handle.readline()
                handle.seek(prefix.scanned + len(whole))
                headers = _HEADER.findall(whole.decode("utf-8", errors="replace"))
                prefix.last = headers[-1] if headers else prefix.last
                prefix.scanned += len(whole)
        return prefix.last


def _read_tail(path: Path) -> tuple[str, str | None]:
    """The last :data:`TAIL_BYTES` of ``path`` from a line's start, and the worker writing at that start."""
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        start = max(0, size - TAIL_BYTES)
        handle.seek(start)
        data = handle.read()
        inode = path.stat().st_ino
    if start:
        cut = data.find(b"\n") + 1  # the first whole line
        data, start = data[cut:], start + cut
    writing = _writer_before(path, inode, start) if start else None
    return data.decode("utf-8", errors="replace"), writing


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
            text, writing = _read_tail(path)
        except OSError:
            continue
        mine = [rows for worker, rows in worker_sections(text, writing).items() if worker in wanted]
        if mine:
            read.append(path)
        for rows in mine:
            stamp = ""
            for line in rows:
                stamp = line[:_STAMP_CHARS] if _STAMP.match(line) else stamp
                stamped.append((stamp, len(stamped), line))
    tail: deque[str] = deque((line for _, _, line in sorted(stamped)), maxlen=lines)  # workers ran in parallel
    return LogTail([redact(line) for line in tail], read)
