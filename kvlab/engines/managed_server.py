"""Run an inference server as a child process: start it, wait until it is healthy, stop it for good.

The server runs in its own session (a new process group): vLLM and SGLang each start several
processes (API server, engine core / scheduler, detokenizer), and signalling the group is the only
way to reach all of them, including ones whose parent already died.  Its stdout and stderr go to a
log file, which is how kvlab learns the KV pool size and why a start failed.

A server never outlives the process that launched it, however that process ends: a watchdog
(:data:`WATCHDOG`, a few lines run by kvlab's own interpreter in a session of its own) waits on a
pipe whose only writer is the launching process; the kernel closes it when that process ends (a
SIGKILL included, where no ``finally`` runs), and the watchdog then stops the server's process group
as :meth:`ManagedServer.stop` does.  A pipe rather than ``PR_SET_PDEATHSIG``: the kernel sends that
signal when the *thread* that forked the server ends, and kvlab launches servers from threads that
end long before their process (a worker's, the dashboard's).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from kvlab.cpu_priority import pass_on_session_niceness

TAIL_LINES = 30
#: Seconds between SIGINT, SIGTERM and SIGKILL when a server is stopped (by :meth:`ManagedServer.stop` or its watchdog).
STOP_GRACE_S = 20.0
#: The watchdog's script (argv: the server's process group, the grace in seconds; stdin: the launcher's pipe).  It
#: ignores SIGINT and SIGTERM (a Ctrl-C of the terminal reaches it too) and lives in a session of its own, so that it
#: sees the server's group empty.
WATCHDOG = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.buffer.read()  # returns at end of file: the process that launched the server has ended
def signal_group(sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
for sig in (signal.SIGINT, signal.SIGTERM):
    if not signal_group(sig):
        sys.exit(0)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and signal_group(0):
        time.sleep(0.1)
signal_group(signal.SIGKILL)
"""


class ServerStartError(RuntimeError):
    """The server exited, or never became healthy, during start-up; the message ends with its log tail."""

    def __init__(self, message: str, exit_code: int | None, log_tail: str):
        super().__init__(f"{message}; last lines of the server log:\n{log_tail}")
        self.exit_code = exit_code
        self.log_tail = log_tail


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ManagedServer:
    """One server process and its log.

    ``env`` is added to this process's environment (not a replacement for it: the server needs
    PATH, CUDA and cache variables); pass secrets such as ``VLLM_API_KEY`` here, never in
    ``command``.  The log file is appended to, so it keeps earlier runs; :meth:`log_text` returns
    this run's part.  Use as a context manager to start, wait until healthy, and always stop.
    """

    def __init__(self, command: list[str], health_url: str, log_path: Path, env: dict[str, str] | None = None,
                 startup_timeout_s: float = 900.0, poll_s: float = 0.5, stop_grace_s: float = STOP_GRACE_S):
        self.command = list(command)
        self.health_url = health_url
        self.log_path = Path(log_path)
        self.env = env
        self.startup_timeout_s = startup_timeout_s
        self.poll_s = poll_s
        self.stop_grace_s = stop_grace_s
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lifeline: int | None = None  # the write end of the watchdog's pipe, held until stop()
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group id."""
        return self._process.pid if self._process else None

    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError("this server was already started; make a new ManagedServer to start another")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 -- closed by stop()
        self._log_start = self._log.tell()
        try:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None, start_new_session=True)
        except OSError as error:  # no such interpreter, not executable ...
            self._log.close()
            raise ServerStartError(f"could not run {self.command[0]!r}: {error}", None, "") from None
        pass_on_session_niceness(self._process.pid)  # a background worker's server yields as the worker does
        self._watch(self._process.pid)
        return self

    def _watch(self, pgid: int) -> None:
        """Start the server's watchdog (:data:`WATCHDOG`); this process keeps the write end of its pipe, which no
        child inherits (``os.pipe`` makes it non-inheritable)."""
        read_end, self._lifeline = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", WATCHDOG, str(pgid), str(self.stop_grace_s)], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read_end)

    def wait_healthy(self) -> None:
        """Poll the health URL until it answers 200.

        Raises :class:`ServerStartError` if the process exits first, or if ``startup_timeout_s``
        passes (model loading and CUDA graph capture take minutes, a hang would take forever);
        either way the server is stopped.
        """
        if self._process is None:
            raise RuntimeError("start() the server first")
        deadline = time.monotonic() + self.startup_timeout_s
        # trust_env=False: the server is ours, on this host; an HTTP(S)_PROXY must not reroute it.
        with httpx.Client(timeout=10.0, trust_env=False) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    self.stop()  # for workers it may have left behind
                    raise ServerStartError(f"server exited with code {code} before {self.health_url} answered",
                                           code, self.log_tail())
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet, or busy loading
                if time.monotonic() >= deadline:
                    self.stop()
                    raise ServerStartError(f"server not healthy at {self.health_url} after "
                                           f"{self.startup_timeout_s:g} s; stopped it", None, self.log_tail())
                time.sleep(self.poll_s)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        """What this run of the server has written so far (stdout and stderr interleaved)."""
        try:
            with open(self.log_path, "rb") as file:
                file.seek(self._log_start)
                return file.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the whole process group: SIGINT, then SIGTERM, then SIGKILL (``grace_s`` apart; None:
        ``stop_grace_s``), then its watchdog.  Safe to call again.

        SIGINT first because both engines shut down cleanly on it (freeing GPU memory and their
        worker processes); SIGTERM after ``grace_s``; SIGKILL after as long again.  SIGKILL also
        goes to the group once the server has exited, for any worker it left behind (orphans
        would keep their GPU memory).
        """
        process = self._process
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        if process is not None and not self._stopped:
            self._stopped = True
            for sig in (signal.SIGINT, signal.SIGTERM):
                if process.poll() is not None or not _signal_group(process.pid, sig):
                    break
                try:
                    process.wait(timeout=grace_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(process.pid, signal.SIGKILL)  # whatever the server left behind in its group
            process.wait()
        if self._watchdog is not None:  # nothing left for it to stop
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True
