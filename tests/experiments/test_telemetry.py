"""Telemetry sources and the sampler.  NVML is replaced at the library boundary (its module
functions), since no NVIDIA GPU exists here; the real one is checked on a lent GPU."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pynvml
import pytest

from kvlab.experiments.telemetry import CpuSource, NvmlSource, SampleContext, TelemetrySampler, detect_sources
from tests.waiting import wait_until


class FakeNvml:
    """The pynvml functions NvmlSource calls, answering like a 141 GB H200 at 37% load."""

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVMLError = pynvml.NVMLError

    def __init__(self):
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=40 * 2**30, total=141 * 2**30, free=101 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_500  # milliwatts

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 51

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=1, usedGpuMemory=2**30), SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * 2**30)]


def test_nvml_source_reads_and_converts_units():
    fake = FakeNvml()
    source = NvmlSource(nvml=fake)
    values = source.read()
    assert values == {"gpu_memory_used_bytes": 40 * 2**30, "gpu_memory_total_bytes": 141 * 2**30,
                      "gpu_utilization": 37, "gpu_power_w": 312.5, "gpu_temperature_c": 51,
                      "process_gpu_memory_bytes": 3 * 2**30}
    source.close()
    assert fake.shutdown


def test_real_nvml_without_gpu_is_reported_not_raised(caplog):
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()  # this machine has no NVIDIA driver
    caplog.set_level("INFO")
    sources = detect_sources()
    assert [s.name for s in sources] == ["cpu"]
    assert [s.name for s in detect_sources(nvml=FakeNvml())] == ["cpu", "nvml"]


def test_cpu_source_reads_process_and_kv_bytes():
    values = CpuSource(kv_bytes=lambda: 1234).read()
    assert values["rss_bytes"] > 10 * 2**20 and values["kv_bytes"] == 1234 and values["cpu_percent"] >= 0


def test_sampler_batches_writes_and_stamps_phase():
    batches = []
    context = SampleContext(experiment_id=7, worker_id="w")
    state = {"phase": "prefill", "trial": 3}
    sampler = TelemetrySampler([CpuSource(), NvmlSource(nvml=FakeNvml())], context, batches.append, rate_hz=20,
                               flush_s=0.2, phase_of=lambda: (state["phase"], state["trial"])).start()
    def written(phase: str):
        return lambda: any(s.phase == phase for batch in batches for s in batch)

    wait_until(written("prefill"), "a batch of prefill samples")
    state["phase"] = "decode"
    wait_until(written("decode"), "a batch of decode samples")
    sampler.stop()
    samples = [s for batch in batches for s in batch]
    assert 2 <= len(batches) < len(samples)  # batched: fewer writes than samples
    assert {s.source for s in samples} == {"cpu", "nvml"} and {s.phase for s in samples} == {"prefill", "decode"}
    assert all(s.experiment_id == 7 and s.trial_id == 3 for s in samples)


def test_rate_is_validated():
    with pytest.raises(ValueError, match="0.1..20"):
        TelemetrySampler([], SampleContext(1, "w"), print, rate_hz=50)


def test_a_failing_writer_loses_samples_not_the_trial():
    def broken(batch):
        raise RuntimeError("disk full")

    sampler = TelemetrySampler([CpuSource()], SampleContext(1, "w"), broken, rate_hz=20, flush_s=0.05).start()
    wait_until(lambda: sampler.errors >= 1, "a failed write")
    sampler.stop()
