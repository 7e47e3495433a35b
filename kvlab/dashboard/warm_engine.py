"""The playground's warm engine: a `kvlab serve` on this machine, started on first use (or attached to), so
that a Run answers in seconds and the dashboard process never imports torch.

One per dashboard process (the page keeps it in ``st.cache_resource``). ``KVLAB_PLAYGROUND_URL`` attaches to a
server already running (its root, e.g. ``http://127.0.0.1:8000``, the key from ``KVLAB_API_KEY``); otherwise the
first Run starts ``kvlab serve`` for the model on a free port of 127.0.0.1, its log in
``kvlab-playground-serve.log``. Its OpenMP threads sleep as soon as they are idle, as those of every process kvlab
starts beside its own others (:func:`kvlab.threads.beside_others`), and its runs compress and decode on one thread
(the engine's ``decode_threads``: waking a sleeping thread for each small kernel cost more than it gave). A spinning
wait (libgomp's, 50,000 spins) saved a second of a warm Run on an idle machine, or beside two niced busy loops (2.35
s against 3.41 s); beside the dashboard's own worker running an experiment (niced, as the launcher starts it) the
same Run took 37 s spinning against 5.9 s, and 12-16 s against 4-7 s beside other busy processes; with the worker's
session niced too (:mod:`kvlab.cpu_priority`), 10,000 spins still made a new item's Run 7.7 s against 5.8 s beside
it (docs/decisions.md). Every fault reaches the page as one :class:`PlaygroundError` line.

A Run streams (``"stream": true``): the server's progress events as it goes, then its answer.  The page runs it
in a thread of its own (:class:`BackgroundRun`), so that it stays responsive while the Run is in flight: it shows
the progress, and its Cancel closes the stream, which stops the run in the server (at its next attention layer).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import httpx

from kvlab.dashboard.process_exit import stop_at_exit
from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.paths import log_dir
from kvlab.secrets import DEFAULT_KEY_VAR, PLAYGROUND_URL_VAR, key_for
from kvlab.threads import beside_others

#: Seconds a Run's stream may stay silent before the page gives up on the server (it sends its progress every
#: quarter of a second, queued or running: :data:`kvlab.serve.app.PROGRESS_EVERY_S`).
SILENCE_TIMEOUT_S = 60.0
#: Seconds the model may take to load on first use.
STARTUP_TIMEOUT_S = 600.0
class PlaygroundError(Exception):
    """One line the page shows: what went wrong and what to do."""


class WarmEngine:
    """The server the playground sends its runs to."""

    def __init__(self, model: str):
        self.model = model
        self.attached = os.environ.get(PLAYGROUND_URL_VAR, "").rstrip("/") or None
        self.api_key = key_for(DEFAULT_KEY_VAR, self.attached).key if self.attached else None  # it belongs there
        self._server: ManagedServer | None = None
        self._root: str | None = self.attached
        self._lock = threading.Lock()
        self._ahead: BackgroundRun | None = None  # the prefill asked for the item a page shows
        # one client for every request (a new one builds its TLS context first: 16-32 ms on an idle 2-core
        # machine, on the way of every prefill ahead); a stream closed early closes its connection
        self._client = httpx.Client(timeout=httpx.Timeout(SILENCE_TIMEOUT_S, connect=10.0), trust_env=False)
        self._ahead_lock = threading.Lock()

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
                f"{self._root}/health", log_dir() / "kvlab-playground-serve.log", env=beside_others(),
                startup_timeout_s=STARTUP_TIMEOUT_S).start()
            stop_at_exit(self._server.stop)  # it runs in its own session: the dashboard's exit must end it
            try:
                self._server.wait_healthy()
            except ServerStartError as error:
                last = next((line for line in reversed(error.log_tail.splitlines()) if line.strip()), "")
                raise PlaygroundError(f"kvlab serve for {self.model} did not start: {last or error}"
                                      f" (log: {self._server.log_path})") from None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def prefill_ahead(self, body: dict[str, Any]) -> BackgroundRun | None:
        """Have the server prefill ``body``'s item for its configs now (``prefill_only``, in a thread of its own),
        so that a Run of it finds the prefill done or under way: a new item's Run waits for no prefill once
        the page has shown it for a second or two.  Only on a server that is up (showing an item starts
        none); once per body; a prefill of another item in flight is cancelled (the server holds one prefill:
        the newer one replaces it), one of the same item left to finish (the server reuses it where the
        configs score the same).  Returns the prefill's thread, None where none was started."""
        if not self.started:
            return None
        key = _key(body)
        with self._ahead_lock:
            if self._ahead is not None and self._ahead.key == key:
                return None
            if self._ahead is not None and _item(self._ahead.key) != _item(key):
                self._ahead.cancel()
            self._ahead = BackgroundRun(lambda report, cancelled: self.run(body | {"prefill_only": True}, report,
                                                                           cancelled), key)
            return self._ahead

    def _cancel_other_prefill(self, body: dict[str, Any]) -> None:
        """A Run of another item than the prefill in flight: that prefill would only delay it."""
        with self._ahead_lock:
            if self._ahead is not None and _item(self._ahead.key) != _item(_key(body)):
                self._ahead.cancel()

    def _behind_its_prefill(self, body: dict[str, Any], report: Callable[[dict[str, Any]], None]
                            ) -> Callable[[dict[str, Any]], None]:
        """``report``, but a Run queued behind its own item's prefill ahead says what that prefill is doing (it is
        this Run's work, not another request's)."""
        key = _key(body)

        def reporting(progress: dict[str, Any]) -> None:
            ahead = self._ahead
            if progress.get("phase") == "queued" and ahead is not None and ahead.key == key and not ahead.done:
                progress = progress | {"phase": ahead.progress.get("phase", "queued")}
            report(progress)

        return reporting

    def run(self, body: dict[str, Any], report: Callable[[dict[str, Any]], None] = lambda _: None,
            cancelled: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
        """One playground run (``POST /kvlab/playground``, streamed): each progress event handed to ``report``, the
        answer returned, or None once ``cancelled()`` (checked at each event: the stream is closed, and the server
        stops the run).  A server that died is started again next time."""
        self.start()
        if not body.get("prefill_only"):
            self._cancel_other_prefill(body)
            report = self._behind_its_prefill(body, report)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            with self._client.stream("POST", f"{self._root}/kvlab/playground", json=body | {"stream": True},
                                     headers=headers) as response:
                if response.status_code != 200:
                    response.read()
                    raise PlaygroundError(f"the server refused the run ({response.status_code}): "
                                          f"{_message(response.text, response.status_code)}")
                for line in response.iter_lines():
                    if cancelled():
                        return None
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    if "progress" in event:
                        report(event["progress"])
                    elif "answer" in event:
                        return dict(event["answer"])
                    elif "error" in event:
                        raise PlaygroundError(f"the server stopped the run: {event['error'].get('message', event)}")
        except httpx.TimeoutException:
            raise PlaygroundError(f"the server at {self._root} sent nothing for {SILENCE_TIMEOUT_S:g} s: check its "
                                  "log, or try again") from None
        except httpx.HTTPError as error:
            where = "the attached server" if self.attached else "the playground's server"
            raise PlaygroundError(f"{where} at {self._root} is not answering ({type(error).__name__}); "
                                  + ("check it is running" if self.attached else "Run starts it again")) from None
        raise PlaygroundError(f"the server at {self._root} ended the run's stream without an answer")


def _key(body: dict[str, Any]) -> str:
    """What a request runs (its body but how it is sent): a prefill ahead and the Run it is for have the same."""
    return json.dumps({k: v for k, v in body.items() if k not in ("stream", "prefill_only")}, sort_keys=True)


def _item(key: str) -> str:
    """The item a request's :func:`_key` prefills (and the model and budget it prefills them for)."""
    body = json.loads(key)
    return json.dumps([body.get("model"), body.get("item"), body.get("max_new_tokens")], sort_keys=True)


def _message(text: str, status: int) -> str:
    """An error answer's message (OpenAI's shape), else the start of its text."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text[:200] or f"HTTP {status}"


class BackgroundRun:
    """A Run in a thread of its own, so that the page stays responsive while it is in flight: the page reads its
    :attr:`progress`, may :meth:`cancel` it, and draws its :attr:`answer` or its :attr:`error` once :attr:`done`.

    ``work(report, cancelled)`` does the Run: hands each progress (a dict) to ``report``, returns the answer,
    or None once ``cancelled()``; its :class:`PlaygroundError` is kept as the Run's error.
    """

    def __init__(self, work: Callable[[Callable[[dict[str, Any]], None], Callable[[], bool]], dict[str, Any] | None],
                 key: str):
        self.key = key  # what the Run ran (the view's parameters): the page tells an earlier Run's answer by it
        self.progress: dict[str, Any] = {"phase": "sent"}
        self.answer: dict[str, Any] | None = None
        self.error: str | None = None
        self._work = work
        self._cancel = threading.Event()
        self._done = threading.Event()
        threading.Thread(target=self._run, name="kvlab-playground-run", daemon=True).start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float) -> bool:
        """Whether the Run is done, after waiting ``timeout`` seconds at most."""
        return self._done.wait(timeout)

    def _report(self, progress: dict[str, Any]) -> None:
        self.progress = progress

    def _run(self) -> None:
        try:
            self.answer = self._work(self._report, self._cancel.is_set)
        except PlaygroundError as error:
            self.error = str(error)
        except Exception as error:  # a fault of this page's own: said in one line, never a traceback
            self.error = f"the Run failed ({type(error).__name__}: {error})"
        finally:
            self._done.set()
