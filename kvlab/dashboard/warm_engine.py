"""The playground's warm engine: a `kvlab serve` on this machine, started on first use (or attached to), so
that a Run answers in seconds and the dashboard process never imports torch.

One per dashboard process (the page keeps it in ``st.cache_resource``).  ``KVLAB_PLAYGROUND_URL`` attaches
to a server already running (its root, e.g. ``http://127.0.0.1:8000``, the key from ``KVLAB_API_KEY``);
otherwise the first Run starts ``kvlab serve`` for the model on a free port of 127.0.0.1, its log in
``kvlab-playground-serve.log``.  Every fault reaches the page as one :class:`PlaygroundError` line.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

import httpx

from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.paths import log_dir
from kvlab.secrets import DEFAULT_KEY_VAR, read_setting
from kvlab.threads import WAIT_POLICY_VARS

URL_VAR = "KVLAB_PLAYGROUND_URL"
#: Seconds a Run may take before the page says the server is busy (a long answer on a slow machine).
RUN_TIMEOUT_S = 300.0
#: Seconds the model may take to load on first use.
STARTUP_TIMEOUT_S = 600.0
#: How the server's idle OpenMP threads wait between kernels: libgomp's spin count, a sixth of its default.
#: ``kvlab`` processes otherwise sleep at once (:func:`kvlab.threads.share_cores`, right beside other busy
#: processes); a playground Run is interactive and its server the one busy process then: on 2 cores its
#: 4 default configs took 4.4 s sleeping at once, 3.3 s with this spin, 3.1 s with libgomp's default
#: (docs/decisions.md).  A wait policy already in the environment wins.
SERVER_WAIT_POLICY = {"GOMP_SPINCOUNT": "50000"}


class PlaygroundError(Exception):
    """One line the page shows: what went wrong and what to do."""


class WarmEngine:
    """The server the playground sends its runs to."""

    def __init__(self, model: str):
        self.model = model
        self.attached = os.environ.get(URL_VAR, "").rstrip("/") or None
        self.api_key = read_setting(DEFAULT_KEY_VAR)[0] if self.attached else None
        self._server: ManagedServer | None = None
        self._root: str | None = self.attached
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether a server is there to answer (attached, or started here and alive)."""
        return self.attached is not None or (self._server is not None and self._server.alive())

    def start(self) -> None:
        """Start ``kvlab serve`` unless one is running (or attached): returns once it answers ``/health``."""
        with self._lock:
            if self.started:
                return
            port = free_port()
            self._root = f"http://127.0.0.1:{port}"
            self._server = ManagedServer(
                [sys.executable, "-m", "kvlab.cli", "serve", "--model", self.model, "--port", str(port)],
                f"{self._root}/health", log_dir() / "kvlab-playground-serve.log",
                env=None if any(os.environ.get(name) for name in WAIT_POLICY_VARS) else SERVER_WAIT_POLICY,
                startup_timeout_s=STARTUP_TIMEOUT_S).start()
            atexit.register(self._server.stop)  # it runs in its own session: the dashboard's exit must end it
            try:
                self._server.wait_healthy()
            except ServerStartError as error:
                last = next((line for line in reversed(error.log_tail.splitlines()) if line.strip()), "")
                raise PlaygroundError(f"kvlab serve for {self.model} did not start: {last or error}"
                                      f" (log: {self._server.log_path})") from None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def run(self, body: dict[str, Any]) -> dict[str, Any]:
        """One playground run (``POST /kvlab/playground``); a server that died is started again next time."""
        self.start()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            with httpx.Client(timeout=RUN_TIMEOUT_S, trust_env=False) as client:
                response = client.post(f"{self._root}/kvlab/playground", json=body, headers=headers)
        except httpx.TimeoutException:
            raise PlaygroundError(f"the server at {self._root} did not answer within {RUN_TIMEOUT_S:g} s (busy "
                                  "with a long answer?): try fewer configs or fewer tokens") from None
        except httpx.HTTPError as error:
            where = "the attached server" if self.attached else "the playground's server"
            raise PlaygroundError(f"{where} at {self._root} is not answering ({type(error).__name__}); "
                                  + ("check it is running" if self.attached else "Run starts it again")) from None
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:200]
            raise PlaygroundError(f"the server refused the run ({response.status_code}): {message}")
        return response.json()
