"""Telemetry: sources (NVML for GPUs, psutil + the engine's KV bytes for the process), a sampler
thread, and batched writes.

Each sample carries the experiment, the trial being evaluated and the engine's phase
(:data:`kvlab.engines.base.Phase`), so a chart can show what memory did when.
With no NVIDIA GPU (or no driver) the NVML source is skipped and that is said once in the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from kvlab.engines.base import TelemetryReading, TelemetrySource  # engines declare theirs: see Engine.telemetry_sources
from kvlab.store.records import TelemetrySample

log = logging.getLogger(__name__)

MIN_HZ, MAX_HZ = 0.1, 20.0


class CpuSource:
    """This process: resident memory, CPU %, and the engine's KV bytes in use right now."""

    name = "cpu"

    def __init__(self, kv_bytes: Callable[[], int | None] | None = None):
        self.process = psutil.Process(os.getpid())
        self.process.cpu_percent(None)  # prime: the first call always answers 0.0
        self.kv_bytes = kv_bytes or (lambda: None)

    def read(self) -> TelemetryReading:
        return {"rss_bytes": self.process.memory_info().rss, "cpu_percent": self.process.cpu_percent(None),
                "kv_bytes": self.kv_bytes()}

    def close(self) -> None:
        """Nothing to release."""


class NvmlSource:
    """One NVIDIA GPU through NVML (``nvidia-ml-py``): memory, utilization, power, temperature, and
    the GPU memory this process holds."""

    name = "nvml"

    def __init__(self, index: int | None = None, nvml: Any = None):
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        nvml.nvmlInit()
        # NVML counts every GPU of the host: by default sample the first one this process may use (a Ray
        # actor's CUDA_VISIBLE_DEVICES names the GPU Ray granted it, by index or by UUID)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if index is None and visible.startswith(("GPU-", "MIG-")):
            self.handle = nvml.nvmlDeviceGetHandleByUUID(visible)
        else:
            self.handle = nvml.nvmlDeviceGetHandleByIndex(int(visible) if index is None and visible.isdigit()
                                                          else index or 0)
        self.pid = os.getpid()

    def read(self) -> TelemetryReading:
        nvml, handle = self.nvml, self.handle
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        values: TelemetryReading = {
            "gpu_memory_used_bytes": memory.used, "gpu_memory_total_bytes": memory.total,
            "gpu_utilization": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "gpu_power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "gpu_temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "process_gpu_memory_bytes": None,
        }
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == self.pid:
                values["process_gpu_memory_bytes"] = process.usedGpuMemory
        return values

    def close(self) -> None:
        self.nvml.nvmlShutdown()


_no_gpu_reported = False


def detect_sources(kv_bytes: Callable[[], int | None] | None = None, nvml: Any = None) -> list[TelemetrySource]:
    """The CPU source, plus NVML when a GPU answers; a missing GPU is logged once, never raised."""
    global _no_gpu_reported
    sources: list[TelemetrySource] = [CpuSource(kv_bytes)]
    try:
        sources.append(NvmlSource(nvml=nvml))
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, no device, no package ...
        if not _no_gpu_reported:
            log.info("no NVIDIA GPU telemetry (%s: %s); sampling CPU and process memory only",
                     type(error).__name__, error)
            _no_gpu_reported = True
    return sources


@dataclass
class SampleContext:
    """What the sampler stamps on each sample; the worker updates it as work moves on."""

    experiment_id: int
    worker_id: str
    trial_id: int | None = None
    phase: str = "idle"


@dataclass
class TelemetrySampler:
    """Samples every source at ``rate_hz`` on a daemon thread and writes batches through ``write``.

    Writes are batched (every ``flush_s`` seconds) so that 20 Hz sampling costs one insert a
    second, not twenty.  ``stop()`` flushes what is left.
    """

    sources: list[TelemetrySource]
    context: SampleContext
    write: Callable[[list[TelemetrySample]], None]
    rate_hz: float = 1.0
    flush_s: float = 2.0
    phase_of: Callable[[], tuple[str, int | None]] | None = None
    _buffer: list[TelemetrySample] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    errors: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not MIN_HZ <= self.rate_hz <= MAX_HZ:
            raise ValueError(f"telemetry rate {self.rate_hz} Hz: allowed {MIN_HZ}..{MAX_HZ} Hz")

    def start(self) -> TelemetrySampler:
        self._thread = threading.Thread(target=self._loop, name="kvlab-telemetry", daemon=True)
        self._thread.start()
        return self

    def sample_once(self) -> None:
        phase, trial_id = self.phase_of() if self.phase_of else (self.context.phase, self.context.trial_id)
        now = time.time()
        for source in self.sources:
            try:
                values = source.read()
            except Exception as error:  # a flaky sensor must not kill the trial
                self.errors += 1
                log.debug("telemetry source %s failed: %s", source.name, error)
                continue
            if not values:  # e.g. a server between launches: nothing to record
                continue
            self._buffer.append(TelemetrySample(
                experiment_id=self.context.experiment_id, trial_id=trial_id, worker_id=self.context.worker_id,
                ts=now, phase=phase, source=source.name, **values))

    def flush(self) -> None:
        batch, self._buffer = self._buffer, []
        if batch:
            try:
                self.write(batch)
            except Exception as error:
                self.errors += 1
                log.warning("telemetry write failed (%d samples dropped): %s", len(batch), error)

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_flush = time.monotonic() + self.flush_s
        while not self._stop.wait(period):
            self.sample_once()
            if time.monotonic() >= next_flush:
                self.flush()
                next_flush = time.monotonic() + self.flush_s

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()
        for source in self.sources:
            source.close()
