"""What a server says of itself while a load level runs, read from its Prometheus ``/metrics`` by its engine's metric
names (:attr:`kvlab.engines.servers.base.ServingEngine.metrics`): the most requests it ran at once, the longest
queue, its preemptions (vLLM) or retractions (SGLang) during the level, the highest share of its pool in use."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvlab.engines.prometheus import ServerKV, ServerMetricsSource
from kvlab.load.metrics import ServerReading

#: Seconds between two readings: a request of the workloads kvlab sends lasts seconds on a CPU, tenths on a GPU.
PERIOD_S = 0.1


def _most(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def watch_server(root_url: str, kind: str, period_s: float = PERIOD_S) -> Callable[[], Callable[[], ServerReading]]:
    """For :func:`kvlab.load.client.run_level`: start reading ``root_url``'s ``/metrics`` (a ``kind`` server, or
    ``kvlab`` serve) in a thread, and return what stops it and sums the readings up."""

    def start() -> Callable[[], ServerReading]:
        source = ServerMetricsSource(root_url, kind)
        readings: list[ServerKV] = []
        done = threading.Event()

        def read_once() -> None:
            source.read()
            if source.last is not None:
                readings.append(source.last)

        def loop() -> None:
            while not done.wait(period_s):
                read_once()

        read_once()  # the counters before the first request
        thread = threading.Thread(target=loop, name="kvlab-load-monitor", daemon=True)
        thread.start()

        def stop() -> ServerReading:
            done.set()
            thread.join()
            read_once()  # and after the last
            source.close()
            preempted = [r.preemptions for r in readings if r.preemptions is not None]
            return ServerReading(max_running=_most([r.running for r in readings]),
                                 max_waiting=_most([r.waiting for r in readings]),
                                 preemptions=preempted[-1] - preempted[0] if preempted else None,
                                 max_usage=_most([r.usage for r in readings]), samples=len(readings))

        return stop

    return start
