"""A real ``kvlab serve`` process on 127.0.0.1 for the serving tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvlab.engines.managed_server import ManagedServer, free_port
from tests.waiting import SAFETY_S

API_KEY_VAR = "KVLAB_TEST_SERVE_KEY"
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
