"""The memory of well-known GPUs, for projections to a GPU that is not on this host (``kvlab capacity --gpu``).

Each figure is the total that NVML reports for the card (``nvidia-smi``'s "Total" in MiB), not the marketing
figure: an "80 GB" H100 reports 81,559 MiB.  On a host with a GPU, ``--gpu this`` reads NVML instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.errors import ConfigError
from kvlab.core.units import MIB


@dataclass(frozen=True)
class GPU:
    name: str
    title: str
    memory_bytes: int


#: name -> GPU; memory as NVML reports it.
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("h100-80gb", "NVIDIA H100 80GB HBM3", 81_559 * MIB),
    GPU("h200", "NVIDIA H200 141GB HBM3e", 143_771 * MIB),
    GPU("a100-80gb", "NVIDIA A100 80GB", 81_920 * MIB),
    GPU("a100-40gb", "NVIDIA A100 40GB", 40_960 * MIB),
    GPU("l40s", "NVIDIA L40S 48GB", 46_068 * MIB),
    GPU("l4", "NVIDIA L4 24GB", 23_034 * MIB),
    GPU("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 24_564 * MIB),
)}


def gpu(name: str) -> GPU:
    """A GPU of the table, or ``this``: the first GPU NVML sees here; :class:`ConfigError` otherwise."""
    if name in GPUS:
        return GPUS[name]
    if name == "this":
        from kvlab.engines.host import host_gpu_memory

        found = host_gpu_memory()
        if found is None:
            raise ConfigError("--gpu this: NVML sees no NVIDIA GPU on this host; name one of " + ", ".join(GPUS))
        return GPU("this", found[0], found[1])
    raise ConfigError(f"unknown GPU {name!r}: give one of {', '.join(GPUS)}, 'this' (NVML), or --memory-gib")
