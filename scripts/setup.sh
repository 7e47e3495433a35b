#!/usr/bin/env bash
# Set up kvlab in .venv and pull the default model. Idempotent: a second run is quick.
#   scripts/setup.sh          # kvlab and the default model
#   scripts/setup.sh --dev    # plus the test tools and Ray (the kvlab[ray] extra)
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--dev" ] && extras="[dev,ray]"  # the tests run a two-node Ray cluster (tests/experiments/test_ray_executor.py)
# One line per step; pip's own lines aside, nothing else (`KVLAB_VERBOSE=1` shows the libraries' logs).
step() { echo "setup: $*" >&2; }

step "virtual environment .venv"
python3 -m venv .venv 2>/dev/null || true
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --upgrade pip

# torch first, so nothing later pulls a second (multi-GB) build: the CPU wheel here,
# the default CUDA build where an NVIDIA GPU is present.
if ! python -c "import torch" 2>/dev/null; then
  step "torch (a large download, once)"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install --quiet torch
  else
    python -m pip install --quiet "torch==2.13.0"
  fi
fi

step "kvlab${extras:+ with its test tools}"
# setuptools' "Editable installation" warning (a box of stars on every install) says nothing to act on.
PYTHONWARNINGS="ignore:Editable installation" python -m pip install --quiet -e ".${extras}"
step "the default model (smollm2-135m)"
kvlab models pull smollm2-135m
step "done: .venv/bin/streamlit run app.py, or .venv/bin/kvlab --help"
