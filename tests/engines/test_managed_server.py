"""ManagedServer against real subprocesses on 127.0.0.1 (small `python -c` servers, no engine)."""

from __future__ import annotations

import re
import socket
import sys
import time

import psutil
import pytest

from kvlab.engines.managed_server import ManagedServer, ServerStartError, free_port
from kvlab.engines.servers import SERVERS
from tests.waiting import SAFETY_S, wait_until

# Refuses connections for 0.2 s, answers 503 for 0.4 s more, then 200 on /health; logs a vLLM pool line.
SLOW_SERVER = r"""
import http.server, sys, time
port = int(sys.argv[1])
print("(EngineCore_DP0 pid=1) INFO 10-07 09:13:05 [gpu_worker.py:298] Available KV cache memory: 1.00 GiB")
print("(EngineCore_DP0 pid=1) INFO 10-07 09:13:05 [kv_cache_utils.py:1087] GPU KV cache size: 8,192 tokens",
      flush=True)
time.sleep(0.2)
ready_at = time.monotonic() + 0.4
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and time.monotonic() >= ready_at
        self.send_response(200 if ok else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

FAILING_SERVER = r"""
import sys
print("loading weights ...", flush=True)
print("ValueError: --kv-cache-dtype fp8_e4m3 is not supported on this GPU", file=sys.stderr, flush=True)
sys.exit(3)
"""

# Spawns a worker that ignores SIGINT and SIGTERM and outlives its parent (it shares the server's
# process group, as engine workers do); only the final SIGKILL to the group ends it.
PARENT_WITH_WORKER = r"""
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", STUBBORN_WORKER])
print(f"worker pid {worker.pid}", flush=True)
time.sleep(60)
""".replace("STUBBORN_WORKER", repr(
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('worker ready', flush=True); time.sleep(60)"))

STUBBORN = r"""
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGINT and SIGTERM", flush=True)
time.sleep(60)
"""


def _server(tmp_path, script, *args, **kwargs) -> tuple[ManagedServer, int]:
    port = free_port()
    command = [sys.executable, "-c", script, str(port), *args]
    return ManagedServer(command, f"http://127.0.0.1:{port}/health", tmp_path / "server.log", **kwargs), port


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_free_port_is_bindable():
    port = free_port()
    assert 1024 <= port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_becomes_healthy_and_logs_the_pool(tmp_path):
    server, _ = _server(tmp_path, SLOW_SERVER, startup_timeout_s=SAFETY_S, poll_s=0.1)
    with server:
        assert server.alive()
        pool = SERVERS["vllm"].parse_pool(server.log_text())
        assert pool is not None and pool.tokens == 8192 and pool.bytes == 1 << 30
    assert not server.alive()
    server.stop()  # idempotent


def test_log_text_is_this_runs_part_of_an_appended_log(tmp_path):
    (tmp_path / "server.log").write_text("GPU KV cache size: 1 tokens\n")
    server, _ = _server(tmp_path, SLOW_SERVER, startup_timeout_s=SAFETY_S, poll_s=0.1)
    with server:
        assert SERVERS["vllm"].parse_pool(server.log_text()).tokens == 8192
        assert "GPU KV cache size: 1 tokens" not in server.log_text()
    assert (tmp_path / "server.log").read_text().startswith("GPU KV cache size: 1 tokens")


def test_exit_at_start_raises_with_exit_code_and_log_tail(tmp_path):
    server, _ = _server(tmp_path, FAILING_SERVER, startup_timeout_s=SAFETY_S, poll_s=0.1)
    server.start()
    with pytest.raises(ServerStartError) as error:
        server.wait_healthy()
    assert error.value.exit_code == 3
    message = str(error.value)
    assert "exited with code 3" in message
    assert "loading weights ..." in message and "is not supported on this GPU" in message
    server.stop()


def test_never_healthy_times_out_and_is_stopped(tmp_path):
    server, _ = _server(tmp_path, "import time; print('loading ...', flush=True); time.sleep(60)",
                        startup_timeout_s=1.0, poll_s=0.1)
    server.start()
    pid = server.pid
    with pytest.raises(ServerStartError, match=r"not healthy at http://127\.0\.0\.1:\d+/health after 1 s") as error:
        server.wait_healthy()
    assert error.value.exit_code is None
    assert "loading ..." in error.value.log_tail
    assert not server.alive()
    assert _gone(pid)


def test_stop_kills_the_servers_workers(tmp_path):
    server, _ = _server(tmp_path, PARENT_WITH_WORKER)
    server.start()
    wait_until(lambda: "worker ready" in server.log_text(), "the worker's first line")
    worker = int(re.search(r"worker pid (\d+)", server.log_text()).group(1))
    assert psutil.Process(worker).status() != psutil.STATUS_ZOMBIE
    server.stop(grace_s=5)
    assert not server.alive()
    wait_until(lambda: _gone(worker), "the worker's end")


def test_stop_escalates_to_sigkill(tmp_path):
    server, _ = _server(tmp_path, STUBBORN)
    server.start()
    pid = server.pid
    wait_until(lambda: "ignoring" in server.log_text(), "the server's first line")
    started = time.monotonic()
    server.stop(grace_s=0.3)
    assert time.monotonic() - started < 3
    assert not server.alive() and _gone(pid)


def test_missing_interpreter_is_a_start_error(tmp_path):
    server = ManagedServer(["/nonexistent/python", "-m", "vllm"], "http://127.0.0.1:9/health", tmp_path / "s.log")
    with pytest.raises(ServerStartError, match="could not run '/nonexistent/python'"):
        server.start()


# Issue 47 row 9: "SIGKILL of the run leaves its llama.cpp servers running as orphans".  A process that launches a
# server (and its stubborn worker, which ignores SIGINT and SIGTERM) and then sleeps; killed with SIGKILL, no
# finally of it runs.
LAUNCHER = r"""
import re, sys, threading, time
from pathlib import Path
from kvlab.engines.managed_server import ManagedServer
log = Path(sys.argv[2])
def launch():
    server = ManagedServer([sys.executable, "-c", sys.argv[1]], "http://127.0.0.1:9/health", log, stop_grace_s=0.5)
    server.start()
    return server
if sys.argv[3] == "thread":  # launched from a thread that ends at once: the server must outlive the thread
    launched = []
    thread = threading.Thread(target=lambda: launched.append(launch()))
    thread.start()
    thread.join()
    server = launched[0]
else:
    server = launch()
while "worker pid" not in log.read_text():
    time.sleep(0.05)
print(server.pid, re.search(r"worker pid (\d+)", log.read_text()).group(1), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_server_never_outlives_the_process_that_launched_it_even_killed_with_sigkill(tmp_path, where):
    import os
    import signal
    import subprocess

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, PARENT_WITH_WORKER, str(tmp_path / "server.log"),
                                 where], stdout=subprocess.PIPE, text=True)
    try:
        server, worker = (int(pid) for pid in launcher.stdout.readline().split())
        assert not _gone(server) and not _gone(worker)  # alive while the launcher is, from a thread too
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=SAFETY_S)
        wait_until(lambda: _gone(server) and _gone(worker), "the server and its worker to end with their launcher")
    finally:
        launcher.kill()
        launcher.wait(timeout=SAFETY_S)


def test_stopping_a_server_ends_its_watchdog_too(tmp_path):
    before = {child.pid for child in psutil.Process().children()}  # a session's fixtures may hold servers
    server, _ = _server(tmp_path, SLOW_SERVER, startup_timeout_s=SAFETY_S, poll_s=0.1)
    with server:
        (watchdog,) = [child for child in psutil.Process().children() if child.pid not in before | {server.pid}]
        assert "-c" in watchdog.cmdline()
    assert _gone(watchdog.pid)
