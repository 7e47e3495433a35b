#!/usr/bin/env bash
# Build a real llama.cpp for kvlab, in its own venv: $KVLAB_HOME/engines/llamacpp (default ~/.cache/kvlab).
# The source is the llama.cpp that llama-cpp-python's sdist on PyPI vendors (vendor/llama.cpp): pip builds its
# library with CMake and gcc for this host (GGML_NATIVE: this CPU's own instruction set; CUDA where nvidia-smi
# lists a GPU and nvcc is present) and installs it with its OpenAI-compatible server (llama_cpp.server), which
# kvlab launches.  The built wheel is kept beside the venv (wheels/), so a venv rebuilt later needs no compiler.
#   scripts/install_llamacpp.sh     # about 6 min of 2 idle cores the first time; a second run checks and returns
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "install_llamacpp: $*" >&2; }
home="${KVLAB_HOME:-$HOME/.cache/kvlab}"
venv="$home/engines/llamacpp"
python="$venv/bin/python"
wheels="$home/engines/llamacpp-wheels"
version="0.3.36"
# The import that proves the install: the server module, which loads llama.cpp's shared library.
probe="import llama_cpp, llama_cpp.server.app; assert llama_cpp.__version__ == '$version'"

if [ -x "$python" ] && "$python" -c "$probe" >/dev/null 2>&1; then
  step "llama.cpp (llama-cpp-python $version) already built in $venv"
  exit 0
fi
started=$SECONDS
if ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  for tool in cmake gcc g++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install_llamacpp: $tool is needed (apt-get install cmake g++)" >&2; exit 1; }
  done
  # The shared-library loader (ggml's CPU backend picks no variant at run time) and nothing kvlab does not use:
  # no multimodal library, tests, examples or tools.
  cmake_args="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF"
  if [ "$(uname -m)" = x86_64 ]; then
    # No AMX kernels: on an AMX host (-march=native enables them) its matrix product died with SIGSEGV in
    # ggml_backend_amx_mul_mat on the first 500-token prompt (measured: llama-cpp-python 0.3.36, SmolLM2's Q4_1
    # weights); gcc's explicit -mno-* wins over -march=native whatever their order.
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake_args+=" -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
    step "CUDA build (nvidia-smi lists a GPU, nvcc is present)"
    cmake_args+=" -DGGML_CUDA=ON"
  fi
  step "building llama-cpp-python $version from its sdist (PyPI) for this host, $(nproc) cores: $cmake_args"
  mkdir -p "$wheels"
  build_log="$wheels/build.log"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" nice python3 -m pip wheel --no-deps --no-cache-dir \
      --no-binary llama-cpp-python -w "$wheels" "llama-cpp-python==$version" >"$build_log" 2>&1 \
    || { grep -m 5 -iE "error|fatal" "$build_log" >&2 || tail -n 20 "$build_log" >&2; exit 1; }
  step "built in $((SECONDS - started)) s: $(ls "$wheels"/llama_cpp_python-"$version"-*.whl)"
fi
step "venv $venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$python" -m pip install --quiet --upgrade pip
"$python" -m pip install --quiet --find-links "$wheels" "llama-cpp-python[server]==$version"
"$python" -c "$probe" || { echo "install_llamacpp: llama_cpp does not import in $venv" >&2; exit 1; }
step "done in $((SECONDS - started)) s: $python ($(du -sh "$venv" | cut -f1); the wheel $(du -sh "$wheels" | cut -f1))"
