"""A real dashboard (`streamlit run app.py`) on a free loopback port, for the browser tests and the
page benchmark; and the Chromium they drive."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.waiting import SAFETY_S

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_dashboard(store_url: str, log: Path, extra_env: dict[str, str] | None = None,
                    timeout_s: float = SAFETY_S) -> tuple[subprocess.Popen, str]:
    """Start the dashboard over ``store_url`` (output to ``log``) and wait until it answers its
    health check: ``(process, base URL)``.  The caller stops the process."""
    port = free_port()
    env = dict(os.environ, KVLAB_DATABASE_URL=store_url, KVLAB_CHROMIUM=CHROMIUM, **(extra_env or {}))
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.headless", "true", "--server.address", "127.0.0.1", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read() == b"ok":
                    return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"streamlit did not start: {log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.3)
