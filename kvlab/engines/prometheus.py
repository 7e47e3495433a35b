"""KV-cache readings from a launched server's or ``kvlab serve``'s Prometheus ``/metrics``, and a telemetry source.

Each serving engine's metric names are its module's (:attr:`kvlab.engines.servers.base.ServingEngine.metrics`,
read from its sources); ``kvlab serve``'s (kvlab/serve/metrics.py) are here: ``kvlab:kv_cache_bytes``, measured
from the cache tensors of the request being served, and ``kvlab:num_requests_running`` / ``_waiting``.
Usage figures count the pool held by live requests: blocks kept only for a prefix cache count as free.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvlab.engines.server_logs import KVPool
from kvlab.engines.servers import MetricNames, ServingEngine, serving_engine

if TYPE_CHECKING:
    from kvlab.engines.base import TelemetryReading

log = logging.getLogger(__name__)

#: ``kvlab serve``'s own metrics (kvlab/serve/metrics.py); its bytes are measured (:data:`_KVLAB_BYTES`).
KVLAB_SERVE = "kvlab"
_KVLAB_METRICS = MetricNames(running=("kvlab:num_requests_running",), waiting=("kvlab:num_requests_waiting",))
_KVLAB_BYTES = "kvlab:kv_cache_bytes"


def _server(kind: str) -> ServingEngine | None:
    """The serving engine of ``kind``; None for ``kvlab serve``."""
    return None if kind == KVLAB_SERVE else serving_engine(kind)


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
    """What ``metrics`` (from :func:`parse_metrics`) says about the KV cache of a ``kind`` server (a serving
    engine's kind, or :data:`KVLAB_SERVE`).

    Pool bytes come from the start-up log (``pool``), else from the engine's pool gauge where it has one.
    """
    server = _server(kind)
    names = server.metrics if server is not None else _KVLAB_METRICS
    usage = _first(metrics, names.usage)
    pool_bytes = pool.bytes if pool is not None else None
    if pool_bytes is None and server is not None:
        pool_bytes = server.pool_bytes_from_metrics(metrics)
    kv_bytes = round(usage * pool_bytes) if usage is not None and pool_bytes is not None else None
    if server is None and _KVLAB_BYTES in metrics:
        kv_bytes = round(metrics[_KVLAB_BYTES])
    return ServerKV(usage=usage, kv_bytes=kv_bytes, pool_bytes=pool_bytes,
                    preemptions=_first(metrics, names.preemptions), running=_first(metrics, names.running),
                    waiting=_first(metrics, names.waiting))


class ServerMetricsSource:
    """A :class:`kvlab.experiments.telemetry.TelemetrySource` reading a server's ``<root>/metrics`` (source "server").

    A scrape that fails (server busy, restarting, gone) answers ``{}`` instead of raising: the
    sampler's loop must outlive a flaky server, and a missing reading is not an error.  ``pool`` may
    be set after construction, once the start-up log has been parsed; ``last`` keeps the latest
    snapshot for the engine (preemptions, queue lengths).
    """

    name = "server"

    def __init__(self, root_url: str, kind: str, pool: KVPool | None = None, timeout_s: float = 2.0):
        _server(kind)  # refuses a kind that is neither a serving engine nor kvlab serve
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
