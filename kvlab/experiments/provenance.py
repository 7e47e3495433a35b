"""What a result needs to be reproduced: package versions, git commit, hardware."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any

import psutil

from kvlab.paths import REPO_ROOT

PACKAGES = ("kvlab", "torch", "transformers", "kvpress", "pydantic", "numpy", "scipy")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit() -> str | None:
    """The commit of the kvlab checkout (with ``-dirty`` if it has local changes), or None."""
    root = REPO_ROOT
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def hardware(torch_facts: bool = True) -> dict[str, Any]:
    """This host; ``torch_facts=False`` leaves out torch's threads and GPUs (seconds of imports), for a
    host that only queues the experiment: the worker that runs it records its own environment."""
    info: dict[str, Any] = {
        "platform": platform.platform(), "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
    }
    if not torch_facts:
        return info
    import torch

    info["torch_threads"] = torch.get_num_threads()
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def environment(torch_facts: bool = True) -> dict[str, Any]:
    return {"versions": package_versions(), "git_commit": git_commit(), "hardware": hardware(torch_facts)}
