"""Run an inference server as a child process: start it, wait until it is healthy, stop it for good.

The server runs in its own session (a new process group): vLLM and SGLang each start several
processes (API server, engine core / scheduler, detokenizer), and signalling the group is the only
way to reach all of them, including ones whose parent already died.  Its stdout and stderr go to a
log file, which is how kvlab learns the KV pool size and why a start failed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from kvlab.cpu_priority import pass_on_session_niceness

TAIL_LINES = 30


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
                 startup_timeout_s: float = 900.0, poll_s: float = 0.5):
        self.command = list(command)
        self.health_url = health_url
        self.log_path = Path(log_path)
        self.env = env
        self.startup_timeout_s = startup_timeout_s
        self.poll_s = poll_s
        self._process: subprocess.Popen[bytes] | None = None
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
        return self

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

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group: SIGINT, then SIGTERM, then SIGKILL.  Safe to call again.

        SIGINT first because both engines shut down cleanly on it (freeing GPU memory and their
        worker processes); SIGTERM after ``grace_s``; SIGKILL after as long again.  SIGKILL also
        goes to the group once the server has exited, for any worker it left behind (orphans
        would keep their GPU memory).
        """
        process = self._process
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
