"""Which database, how to connect to it, and what its failures mean to a user.

The URL is the ``url`` argument, else ``$KVLAB_DATABASE_URL``, else the SQLite file
``<repo>/db/kvlab.sqlite``.  Passwords never appear in messages: every URL shown is masked.

SQLite connections get WAL (readers never block the writer), a 30 s busy timeout, foreign keys
and ``synchronous=NORMAL``.  pysqlite's own transaction handling is switched off and kvlab emits
``BEGIN`` itself, so that writes can take the write lock up front with ``BEGIN IMMEDIATE``
(the ``WRITE`` execution option): a deferred transaction that reads and then writes fails with
``database is locked`` without waiting once another writer committed in between.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event, exc, make_url
from sqlalchemy.engine import Connection

from kvlab.errlog import one_line
from kvlab.paths import DEFAULT_SQLITE_PATH
from kvlab.store.errors import StoreError, StoreReadOnlyError

URL_ENV = "KVLAB_DATABASE_URL"
SUPPORTED_DIALECTS = ("sqlite", "postgresql")
#: Execution option: this transaction writes (SQLite: ``BEGIN IMMEDIATE``).
WRITE = "kvlab_write"
BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10


def mask(url: str | URL) -> str:
    """The URL with its password replaced by ``***`` (also for strings that do not parse)."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (exc.ArgumentError, ValueError):
        return re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", url)


def resolve_url(url: str | None = None) -> URL:
    """Parse the store URL; PostgreSQL URLs without a driver get psycopg (kvlab's dependency)."""
    raw = url or os.environ.get(URL_ENV)
    if not raw:
        DEFAULT_SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
        return URL.create("sqlite", database=str(DEFAULT_SQLITE_PATH))
    try:
        parsed = make_url(raw)
    except (exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreError(
            f"malformed database URL {mask(raw)!r}: expected dialect[+driver]://[user[:password]@]host"
            "[:port]/database, e.g. sqlite:///db/kvlab.sqlite or postgresql://user:pw@host:5432/kvlab"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in SUPPORTED_DIALECTS:
        raise StoreError(f"database URL {mask(parsed)!r}: kvlab's store runs on SQLite or PostgreSQL, "
                         f"not {parsed.get_backend_name()!r}")
    return parsed


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL (``sqlite:///path``, or ``sqlite:///file:path?...&uri=true``); None for
    an in-memory database (``sqlite://``, ``:memory:``, ``mode=memory``) and for other dialects."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if url.query.get("uri") == "true":
        if url.query.get("mode") == "memory":
            return None
        database = database.removeprefix("file:")
    return None if database in ("", ":memory:") else Path(database)


def require_shared_store(url: str | None = None) -> None:
    """Refuse an in-memory SQLite database for work that other processes run (local workers, a
    background tune, Ray actors): such a database lives only inside this process, so they would never
    see what is queued there, and it would vanish when this process exits."""
    parsed = resolve_url(url)
    if parsed.get_backend_name() == "sqlite" and sqlite_file(parsed) is None:
        given = re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", url or os.environ.get(URL_ENV, ""))  # as typed, masked
        raise StoreError(f"{given if url else f'{URL_ENV}={given}'} is an in-memory SQLite database, which only "
                         "this process sees: work queued there would never reach the workers (or tune, or Ray "
                         "actors) meant to run it; use a SQLite file (sqlite:///path/kvlab.sqlite) or PostgreSQL")


def create_store_engine(url: URL) -> Engine:
    """An engine with kvlab's connection settings (see the module docstring)."""
    kwargs: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        kwargs["pool_pre_ping"] = True  # workers live for days; the server may restart under them
        if "connect_timeout" not in url.query:
            kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    try:
        engine = create_engine(url, **kwargs)
    except (exc.ArgumentError, exc.NoSuchModuleError, ImportError) as error:
        raise StoreError(f"cannot use the database URL {mask(url)!r}: {error}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # kvlab emits BEGIN itself (_sqlite_begin)
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys = ON")
    try:
        _switch_to_wal(cursor)
    except sqlite3.OperationalError as error:
        # A read-only file that is not in WAL mode yet can still be read; writes report it.
        if "readonly" not in str(error):
            raise
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    """Put the file in WAL mode, waiting for other processes like any other write would.

    Switching needs an exclusive lock, and SQLite answers ``database is locked`` at once instead of
    calling the busy handler when another connection is mid-switch on a new file (several workers
    opening a new database together failed 1 start in 7 this way), so kvlab retries for up to the
    busy timeout itself.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "database is locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01 + random.random() * 0.04)


def _sqlite_begin(connection: Connection) -> None:
    immediate = connection.get_execution_options().get(WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def shown_url(url: str | None = None) -> str:
    """The URL as the user gave it (or the default), password masked: what messages show."""
    raw = url or os.environ.get(URL_ENV)
    return mask(raw) if raw else mask(URL.create("sqlite", database=str(DEFAULT_SQLITE_PATH)))


@contextmanager
def translate_errors(url: URL, shown: str) -> Iterator[None]:
    """Turn driver errors into :class:`StoreError` messages that name the database (``shown``).

    Integrity errors pass through: they mean a bug or a race the caller handles.
    """
    try:
        yield
    except exc.IntegrityError:
        raise
    except exc.DBAPIError as error:
        raise describe_error(url, shown, error) from error


def describe_error(url: URL, shown: str, error: exc.DBAPIError) -> StoreError:
    reason = _first_line(error.orig)
    if url.get_backend_name() == "sqlite":
        path = str(sqlite_file(url) or ":memory:")
        if "file is not a database" in reason:
            return StoreError(f"{path} is not a SQLite database (corrupt, or another kind of file): "
                              f"move it away, or point {URL_ENV} at another database")
        if getattr(error.orig, "sqlite_errorname", "") == "SQLITE_READONLY_DIRECTORY":
            return StoreError(f"the database {path} and its directory are read-only: SQLite cannot create "
                              f"its WAL index ({path}-shm), so it cannot even read it. Make the directory "
                              f"writable, copy the file elsewhere, or read it as an immutable snapshot: "
                              f"sqlite:///file:{path}?immutable=1&uri=true")
        if "readonly" in reason or "read-only" in reason:
            return StoreReadOnlyError(f"the database {path} is read-only (file permissions, or mode=ro / immutable "
                              f"in the URL): kvlab can read it but not write to it")
        if "unable to open database file" in reason:
            return StoreError(f"cannot open the SQLite database {path}: does its directory exist, "
                              "and may this user read and write it?")
        if "database is locked" in reason:
            return StoreError(f"the database {path} is locked by another process (kvlab waits up to "
                              f"{BUSY_TIMEOUT_MS // 1000} s for a write lock)")
    elif error.connection_invalidated or (isinstance(error, exc.OperationalError) and error.statement is None):
        return StoreError(f"cannot reach the database at {shown}: {reason}")
    return StoreError(f"database error at {shown}: {reason}")


def _first_line(error: BaseException | None) -> str:
    text = str(error or "").strip()
    text = text.removeprefix("connection failed: ")
    return text.splitlines()[0].strip() if text else type(error).__name__


# -- SIGBUS: a page of SQLite's mapped -shm file that the file system refused ---------------------------------

class _SigAction(ctypes.Structure):
    """glibc's ``struct sigaction`` on Linux (the same on x86-64 and arm64): a 1024-bit ``sa_mask``."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_SIGBUS_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int)
_sigbus_lock = threading.Lock()
_sigbus_lines: list[Callable[[], str]] = []  # the innermost caller's describes the ending
_sigbus_saved = _SigAction()  # the handler before the first caller's (faulthandler's, or the default)
_sigbus_handler: Any = None  # the C callback, kept alive while it is installed


def _on_sigbus(_signum: int) -> None:
    """Say the caller's line on stderr and end the process with exit status 1, whatever happens on the way: a
    return from this handler would run the faulting write again, and fault again, for ever."""
    try:
        try:
            line = one_line(_sigbus_lines[-1]())
        except BaseException:  # noqa: BLE001 -- a describe that fails still ends the process with a line
            line = "this process ended at a SIGBUS: a memory-mapped file failed under it"
        line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in line)
        os.write(2, f"error: {line}\n".encode("utf-8", "backslashreplace"))
    finally:
        os._exit(1)


def _sigaction(new: _SigAction | None, old: _SigAction | None) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.sigaction(signal.SIGBUS, None if new is None else ctypes.byref(new),
                          None if old is None else ctypes.byref(old)) == 0


@contextmanager
def ending_at_sigbus(describe: Callable[[], str]) -> Iterator[None]:
    """While inside, a SIGBUS ends the process with exit status 1 and one line, ``error: <describe()>``,
    instead of killing it without a word (status -7).

    SQLite maps its WAL index, the ``-shm`` file beside the database, into memory and writes to it on
    most transactions -- a reader too, when it records which WAL frame it reads up to.  Once the file
    system refuses a write to that file (``chattr +i`` on the store's directory and files: ext4 and xfs
    then fail the page fault of a page the kernel wrote back meanwhile), the write is a SIGBUS inside
    SQLite, at whichever query comes first: no check before a query can close that window, and the
    process cannot go on after it.  ``describe`` runs in the handler (a store's :meth:`check_intact`
    naming the store, say) and must only look at files.  Nested and concurrent callers each add
    their line; the innermost one's is said.  A no-op where the C library has no ``sigaction``."""
    global _sigbus_handler
    with _sigbus_lock:
        _sigbus_lines.append(describe)  # before the handler is installed, which reads it
        if len(_sigbus_lines) == 1 and hasattr(signal, "SIGBUS"):
            handler = _SIGBUS_CALLBACK(_on_sigbus)
            try:
                if _sigaction(_SigAction(handler=ctypes.cast(handler, ctypes.c_void_p)), _sigbus_saved):
                    _sigbus_handler = handler
            except (OSError, AttributeError):  # no C library to ask (a platform without sigaction)
                pass
    try:
        yield
    finally:
        with _sigbus_lock:
            if len(_sigbus_lines) == 1 and _sigbus_handler is not None:  # the handler goes before its line
                _sigaction(_sigbus_saved, None)
                _sigbus_handler = None
            _sigbus_lines.remove(describe)
