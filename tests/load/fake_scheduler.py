"""A stand-in for a serving engine's scheduler behind the real HTTP interface (an NVIDIA GPU cannot exist here, and
the real vLLM's load test is tests/engines/test_vllm_real.py's): ``slots`` requests at once (what a KV pool of that
many sequences admits), the rest queued, its queue on ``/metrics`` under vLLM's metric names, its model on
``/v1/models``, its completions streamed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.waiting import SAFETY_S


class Scheduler:
    """``slots`` requests run at once, the rest wait.  With ``gate`` "full", an admitted request streams its tokens
    only once every client of the level has arrived and ``/metrics`` has been read since (so that the monitor sees
    the full queue); with "seen", once ``/metrics`` has been read since it was admitted, for a load's requests only
    (those with ``ignore_eos``: an item's request is not held); with "none", at once.  A test waits on these events,
    never on time."""

    def __init__(self, slots: int, clients: int, gate: str = "full"):
        self.slots, self.clients, self.gate = slots, clients, gate
        self.lock = threading.Condition()
        self.running = self.waiting = self.arrived = self.preempted = 0
        self.reads_after_full = self.reads = 0

    def admit(self, request: dict) -> None:
        with self.lock:
            self.arrived += 1
            self.waiting += 1
            self.lock.notify_all()
            assert self.lock.wait_for(lambda: self.running < self.slots, timeout=SAFETY_S)
            self.waiting -= 1
            self.running += 1
            self.lock.notify_all()
            if self.gate == "seen" and request.get("ignore_eos"):
                read = self.reads
                assert self.lock.wait_for(lambda: self.reads > read, timeout=SAFETY_S)
            if self.gate != "full":
                return
            seen = self.reads_after_full
            assert self.lock.wait_for(lambda: self.arrived >= min(self.clients, self.arrived_cap)
                                      and self.reads_after_full > seen, timeout=SAFETY_S)

    arrived_cap = 10**9  # the level's requests: a level of fewer requests than clients never fills up

    def leave(self) -> None:
        with self.lock:
            self.running -= 1
            self.lock.notify_all()

    def metrics(self) -> str:
        with self.lock:
            self.reads += 1
            self.lock.notify_all()
            if self.arrived >= min(self.clients, self.arrived_cap):
                self.reads_after_full += 1
                self.lock.notify_all()
            return (f"vllm:num_requests_running{{model_name=\"m\"}} {self.running}\n"
                    f"vllm:num_requests_waiting{{model_name=\"m\"}} {self.waiting}\n"
                    f"vllm:num_preemptions_total{{model_name=\"m\"}} {self.preempted}\n"
                    f"vllm:kv_cache_usage_perc{{model_name=\"m\"}} {self.running / self.slots}\n")


def handler_for(scheduler: Scheduler, tokens: int = 5) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path.startswith("/v1/models"):
                model = {"id": "m", "object": "model", "owned_by": "vllm"}  # a vLLM, as its model list says
                body = json.dumps({"object": "list", "data": [model]}).encode()
            else:
                body = scheduler.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if request.get("prompt") == "refuse me":
                body = b'{"error": {"message": "too long"}}'
                self.send_response(400)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            scheduler.admit(request)
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for _ in range(min(tokens, request["max_tokens"])):
                    self.wfile.write(b'data: {"choices": [{"index": 0, "text": " x"}]}\n\n')
                    self.wfile.flush()
                usage = {"prompt_tokens": len(request["prompt"].split()), "completion_tokens": request["max_tokens"]}
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            finally:
                scheduler.leave()
            self.close_connection = True

        def log_message(self, *args):
            pass

    return Handler


@contextmanager
def scheduler_server(scheduler: Scheduler) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(scheduler))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
