"""A real ``kvlab serve`` process on 127.0.0.1 for the serving tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvlab.engines.managed_server import ManagedServer, free_port
from tests.waiting import SAFETY_S

API_KEY_VAR = "KVLAB_TEST_SERVE_API_KEY"  # a key variable is named <NAME>_API_KEY (kvlab.secrets)
API_KEY = "kvlab-test-key-0123456789abcdef"


@contextmanager
def kvlab_serve(log_dir: Path, *args: str, auth: bool = False) -> Iterator[tuple[ManagedServer, str]]:
    """Yield the server and its base URL (``http://127.0.0.1:PORT/v1``); the key, when ``auth``,
    reaches the server through the environment only."""
    port = free_port()
    command = [sys.executable, "-m", "kvlab.cli", "serve", "--port", str(port), "--threads", "1", *args]
    env = dict(os.environ)
    if auth:
        command += ["--api-key-env", API_KEY_VAR]
        env[API_KEY_VAR] = API_KEY
    server = ManagedServer(command, f"http://127.0.0.1:{port}/health", log_dir / f"serve-{port}.log", env=env,
                           startup_timeout_s=SAFETY_S)
    server.start()
    try:
        server.wait_healthy()
        yield server, f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()


class PlainOpenAIHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that says nothing beyond the API: one model on ``/v1/models``, and completions
    of text alone (no token ids, no log-probabilities, nothing about its KV cache)."""

    def _send(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "plain-model", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.rstrip("/") != "/v1/completions":  # no /tokenize, no chat: what a plain server may lack
            self.send_error(501)
            return
        self._send({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "plain-model",
                    "choices": [{"index": 0, "text": " Rome", "finish_reason": "length", "logprobs": None}]})

    def log_message(self, *args):
        pass


@contextmanager
def plain_openai_server(handler: type[BaseHTTPRequestHandler] | None = None) -> Iterator[str]:
    """A :class:`PlainOpenAIHandler` server (or ``handler``'s) on 127.0.0.1; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler or PlainOpenAIHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()


def kvlab_cli(*args: str, db: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``kvlab ARGS`` in a fresh process on the SQLite store ``db``, run from ``cwd`` (however long the host needs)."""
    env = os.environ | {"KVLAB_DATABASE_URL": f"sqlite:///{db}"}
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=SAFETY_S, check=False)


def installed_engine_python(kind: str) -> str:
    """The interpreter of the venv ``scripts/install_{kind}.sh`` made for a launched engine; the test skips without
    it (a failure under the README's test command, which installs it: KVLAB_STRICT_TESTS)."""
    from kvlab.engines.host import default_python
    from kvlab.paths import engine_venv

    python = default_python(kind)
    if python == "python":
        pytest.skip(f"{kind} is not installed in {engine_venv(kind)}: run scripts/install_{kind}.sh")
    return python
