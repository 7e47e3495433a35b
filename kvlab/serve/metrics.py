"""Prometheus metrics of ``kvlab serve`` (named like vLLM's ``vllm:*`` so dashboards carry over)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets from 10 ms to 5 min: CPU prefills of a few thousand tokens take seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class ServerMetrics:
    """One registry per server, so tests can run several servers in one process."""

    def __init__(self, model_name: str, kv_bytes: Callable[[], int | None]):
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        kv = Gauge("kvlab:kv_cache_bytes", "Bytes held by the KV cache of the request being served "
                   "(measured from the cache tensors; 0 when idle)", labelnames=["model_name"],
                   registry=self.registry)
        kv.labels(**labels).set_function(lambda: kv_bytes() or 0)
        self.requests = Counter("kvlab:requests", "Requests by endpoint and the HTTP status they ended with "
                                "(499: the client left before its answer was complete)",
                                ["model_name", "endpoint", "status"], registry=self.registry)
        self.running = Gauge("kvlab:num_requests_running", "Requests being generated",
                             ["model_name"], registry=self.registry).labels(**labels)
        self.waiting = Gauge("kvlab:num_requests_waiting", "Requests queued behind the one being generated",
                             ["model_name"], registry=self.registry).labels(**labels)
        self.ttft = Histogram("kvlab:time_to_first_token_seconds", "Request received to first token generated",
                              ["model_name"], buckets=TTFT_BUCKETS, registry=self.registry).labels(**labels)
        self.tpot = Histogram("kvlab:time_per_output_token_seconds", "Mean time per output token after the first",
                              ["model_name"], buckets=TPOT_BUCKETS, registry=self.registry).labels(**labels)
        self.prompt_tokens = Counter("kvlab:prompt_tokens", "Prompt tokens processed", ["model_name"],
                                     registry=self.registry).labels(**labels)
        self.generation_tokens = Counter("kvlab:generation_tokens", "Tokens generated", ["model_name"],
                                         registry=self.registry).labels(**labels)
        self.last_ratio = Gauge("kvlab:kv_cache_compression_ratio", "Baseline (16-bit) over physical bytes of "
                                "the last request's compressed prompt cache", ["model_name"],
                                registry=self.registry).labels(**labels)
        self.model_name = model_name

    def count(self, endpoint: str, status: int) -> None:
        self.requests.labels(model_name=self.model_name, endpoint=endpoint, status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
