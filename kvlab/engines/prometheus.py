"""KV-cache readings from a vLLM or SGLang server's Prometheus ``/metrics``, and a telemetry source.

Metric names were read from the engines' sources:

* vLLM, vllm/v1/metrics/loggers.py ``PrometheusStatLogger`` (labels ``model_name``, ``engine``):
  gauge ``vllm:kv_cache_usage_perc`` ("KV-cache usage. 1 means 100 percent usage.", a 0..1
  fraction despite its name; ``vllm:gpu_cache_usage_perc`` before 0.9/0.10), gauges
  ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, counter ``vllm:num_preemptions``
  (exposed as ``vllm:num_preemptions_total``).
* SGLang (``--enable-metrics``), python/sglang/srt/observability/metrics_collector.py
  ``SchedulerMetricsCollector``: gauges ``sglang:token_usage`` (0..1), ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:max_total_num_tokens``, counter
  ``sglang:num_retracted_requests_total`` (requests retracted when the pool ran out -- SGLang's
  preemption), and in recent releases ``sglang:kv_cache_memory_usage_gb`` ("Memory used by the
  KV cache pools in GB": the pool's allocated size in GiB, not what is in use).
* ``kvlab serve`` (kvlab/serve/metrics.py): ``kvlab:kv_cache_bytes``, measured from the cache
  tensors of the request being served, and ``kvlab:num_requests_running`` / ``_waiting``.

Both usage figures count the pool held by live requests: blocks kept only for the prefix cache
count as free in both engines.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvlab.engines.server_flags import check_kind
from kvlab.engines.server_logs import GIB, KVPool

if TYPE_CHECKING:
    from kvlab.engines.base import TelemetryReading

log = logging.getLogger(__name__)

_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "preemptions": ("vllm:num_preemptions_total",),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
    },
    "sglang": {
        "usage": ("sglang:token_usage",),
        "preemptions": ("sglang:num_retracted_requests_total",),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
    },
    "kvlab": {
        "usage": (),
        "preemptions": (),
        "running": ("kvlab:num_requests_running",),
        "waiting": ("kvlab:num_requests_waiting",),
    },
}
_KVLAB_BYTES = "kvlab:kv_cache_bytes"


_SGLANG_POOL_GIB = "sglang:kv_cache_memory_usage_gb"
# vllm/v1/metrics/loggers.py PrometheusStatLogger: an info gauge whose labels are the CacheConfig's
# fields, among them kv_cache_size_tokens (what the pool holds), num_gpu_blocks x block_size (the same,
# in blocks), cache_dtype and kv_cache_memory_bytes ("None" when vLLM sized the pool itself).
_VLLM_CACHE_INFO = "vllm:cache_config_info"


def _check_kind(kind: str) -> None:
    if kind != "kvlab":
        check_kind(kind)


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None


def cache_config_pool(text: str) -> KVPool | None:
    """vLLM's KV pool as its ``/metrics`` states it (``vllm:cache_config_info``); None when the text has no
    such gauge.  ``bytes`` is None when vLLM sized the pool itself (its log then says the size)."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name == _VLLM_CACHE_INFO]
    except ValueError:
        return None
    for sample in samples:
        labels = sample.labels
        blocks, block_size = _whole(labels.get("num_gpu_blocks")), _whole(labels.get("block_size"))
        tokens = _whole(labels.get("kv_cache_size_tokens")) or (blocks * block_size if blocks and block_size else None)
        if tokens:
            size = _whole(labels.get("kv_cache_memory_bytes"))
            keys = ("cache_dtype", "kv_cache_size_tokens", "num_gpu_blocks", "block_size", "kv_cache_memory_bytes")
            said = ", ".join(f"{key}={labels[key]}" for key in keys if key in labels)
            return KVPool(tokens, size, f"{_VLLM_CACHE_INFO}{{{said}}}", labels.get("cache_dtype"))
    return None


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets; {} for text that is not Prometheus exposition.

    Sample names are those on the wire (a counter ``x`` reads as ``x_total``, a histogram as
    ``x_bucket`` / ``x_sum`` / ``x_count``).  Summing suits one server with one engine, which is
    how kvlab runs them; NaN samples are skipped.
    """
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isnan(sample.value):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:  # an HTML error page, a truncated body ...: all or nothing
        return {}
    return totals


@dataclass(frozen=True)
class ServerKV:
    """One reading of a server's KV cache; None where the server did not say.

    ``usage`` is the fraction (0..1) of the pool held by live requests; ``kv_bytes`` is that
    share of the pool's bytes (per GPU, like :class:`KVPool`); ``preemptions`` is cumulative
    (vLLM preemptions, SGLang retractions).
    """

    usage: float | None
    kv_bytes: int | None
    pool_bytes: int | None
    preemptions: float | None
    running: float | None
    waiting: float | None


def _first(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((metrics[name] for name in names if name in metrics), None)


def server_kv_snapshot(kind: str, metrics: dict[str, float], pool: KVPool | None) -> ServerKV:
    """What ``metrics`` (from :func:`parse_metrics`) says about the KV cache of a ``kind`` server.

    Pool bytes come from the start-up log (``pool``), else, for SGLang, from its KV memory gauge.
    """
    _check_kind(kind)
    names = _NAMES[kind]
    usage = _first(metrics, names["usage"])
    pool_bytes = pool.bytes if pool is not None else None
    if pool_bytes is None and kind == "sglang" and metrics.get(_SGLANG_POOL_GIB, 0.0) > 0:
        pool_bytes = round(metrics[_SGLANG_POOL_GIB] * GIB)
    kv_bytes = round(usage * pool_bytes) if usage is not None and pool_bytes is not None else None
    if kind == "kvlab" and _KVLAB_BYTES in metrics:
        kv_bytes = round(metrics[_KVLAB_BYTES])
    return ServerKV(usage=usage, kv_bytes=kv_bytes, pool_bytes=pool_bytes,
                    preemptions=_first(metrics, names["preemptions"]),
                    running=_first(metrics, names["running"]), waiting=_first(metrics, names["waiting"]))


class ServerMetricsSource:
    """A :class:`kvlab.experiments.telemetry.TelemetrySource` reading a server's ``<root>/metrics`` (source "server").

    A scrape that fails (server busy, restarting, gone) answers ``{}`` instead of raising: the
    sampler's loop must outlive a flaky server, and a missing reading is not an error.  ``pool`` may
    be set after construction, once the start-up log has been parsed; ``last`` keeps the latest
    snapshot for the engine (preemptions, queue lengths).
    """

    name = "server"

    def __init__(self, root_url: str, kind: str, pool: KVPool | None = None, timeout_s: float = 2.0):
        _check_kind(kind)
        self.url = root_url.rstrip("/") + "/metrics"
        self.kind = kind
        self.pool = pool
        self.last: ServerKV | None = None
        # trust_env=False: the server is ours, on this host; an HTTP(S)_PROXY must not reroute it.
        self.client = httpx.Client(timeout=timeout_s, trust_env=False)

    def read(self) -> TelemetryReading:
        try:
            response = self.client.get(self.url)
            response.raise_for_status()
        except httpx.HTTPError as error:
            log.debug("scrape of %s failed: %s", self.url, error)
            return {}
        metrics = parse_metrics(response.text)
        if not metrics:
            return {}
        self.last = server_kv_snapshot(self.kind, metrics, self.pool)
        return {"kv_bytes": self.last.kv_bytes}

    def close(self) -> None:
        self.client.close()
