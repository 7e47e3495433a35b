"""Converting and loading a model prints kvlab's step lines, not the libraries' per-tensor bars and logs,
unless ``KVLAB_VERBOSE=1`` (what ``--verbose`` sets) asks for them.

A real interpreter converts a real (tiny, 2-layer) GGUF file into an empty ``KVLAB_HOME`` and loads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_models import write_tiny_gguf
from tests.waiting import SAFETY_S

LOAD = "import sys; from kvlab.models import load_model; load_model(sys.argv[1], progress=print)"
LIBRARY_LINES = ("Converting and de-quantizing GGUF tensors", "Materializing param", "Loading weights")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def convert_and_load(gguf: Path, home: Path, verbose: bool) -> str:
    """Everything the process wrote, stdout and stderr together."""
    env = {**os.environ, "KVLAB_HOME": str(home)}
    env.pop("KVLAB_VERBOSE", None)
    if verbose:
        env["KVLAB_VERBOSE"] = "1"
    done = subprocess.run([sys.executable, "-c", LOAD, str(gguf)], env=env, capture_output=True, text=True,
                          timeout=SAFETY_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


@pytest.mark.model
def test_conversion_prints_steps_not_tensors(gguf, tmp_path):
    quiet = convert_and_load(gguf, tmp_path / "quiet", verbose=False)
    assert "Loading and dequantizing tiny.gguf" in quiet and "Verifying" in quiet  # kvlab's steps
    assert not [line for line in LIBRARY_LINES if line in quiet], quiet
    assert len(quiet.encode()) < 1024, quiet
    verbose = convert_and_load(gguf, tmp_path / "verbose", verbose=True)
    assert [line for line in LIBRARY_LINES if line in verbose]  # the libraries' bars: what --verbose shows
