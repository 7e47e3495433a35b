#!/usr/bin/env bash
# Build a real llama.cpp for kvlab, in its own venv: $KVLAB_HOME/engines/llamacpp (default ~/.cache/kvlab).
# The source is the llama.cpp that llama-cpp-python's sdist on PyPI vendors (vendor/llama.cpp): pip builds its
# library with CMake and gcc for this host (GGML_NATIVE: this CPU's own instruction set; CUDA where nvidia-smi
# lists a GPU and nvcc is present) and installs it with its OpenAI-compatible server (llama_cpp.server), which
# kvlab launches.  The built wheel is kept beside the venv (wheels/), so a venv rebuilt later needs no compiler.
# A load phase runs on llama.cpp's own C++ server, llama-server (it batches --parallel slots; llama-cpp-python's
# takes one request at a time): built from the same sdist's sources (tools/server) with the same flags, and put
# beside the venv's Python (a copy kept beside the wheel).
#   scripts/install_llamacpp.sh     # about 6 + 12 min of 2 idle cores the first time; a second run checks and returns
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

server="$venv/bin/llama-server"
if [ -x "$python" ] && "$python" -c "$probe" >/dev/null 2>&1 && "$server" --version >/dev/null 2>&1; then
  step "llama.cpp (llama-cpp-python $version and its llama-server) already built in $venv"
  exit 0
fi
started=$SECONDS
need_tools() {
  for tool in cmake gcc g++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install_llamacpp: $tool is needed (apt-get install cmake g++)" >&2; exit 1; }
  done
}
# The flags of both builds: this CPU's own instruction set (ggml's CPU backend picks no variant at run time).
native_flags="-DGGML_NATIVE=ON"
if [ "$(uname -m)" = x86_64 ]; then
  # No AMX kernels: on an AMX host (-march=native enables them) its matrix product died with SIGSEGV in
  # ggml_backend_amx_mul_mat on the first 500-token prompt (measured: llama-cpp-python 0.3.36, SmolLM2's Q4_1
  # weights); gcc's explicit -mno-* wins over -march=native whatever their order.
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  native_flags+=" -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
  step "CUDA build (nvidia-smi lists a GPU, nvcc is present)"
  native_flags+=" -DGGML_CUDA=ON"
fi
if ! ls "$wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  need_tools
  # The shared library and nothing kvlab does not use: no multimodal library, tests, examples or tools.
  cmake_args="$native_flags -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  cmake_args+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF"
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
if [ ! -x "$wheels/llama-server" ]; then
  need_tools
  source_dir="$wheels/source"
  rm -rf "$source_dir" && mkdir -p "$source_dir"
  step "building llama-server (tools/server of the llama.cpp that llama-cpp-python $version vendors), $(nproc) cores"
  server_log="$wheels/server-build.log"
  {
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$source_dir" \
        "llama-cpp-python==$version" &&
    tar -xzf "$source_dir"/llama_cpp_python-"$version".tar.gz -C "$source_dir" &&
    # a static binary; no web UI (it would be fetched from the network), HTTPS or curl
    eval cmake -S "$source_dir/llama_cpp_python-$version/vendor/llama.cpp" -B "$source_dir/build" \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF "$native_flags" -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
    nice cmake --build "$source_dir/build" --target llama-server -j "$(nproc)" &&
    cp "$source_dir/build/bin/llama-server" "$wheels/llama-server"
  } >"$server_log" 2>&1 || { grep -m 5 -iE "error|fatal" "$server_log" >&2 || tail -n 20 "$server_log" >&2; exit 1; }
  rm -rf "$source_dir"
fi
cp "$wheels/llama-server" "$server"
"$server" --version >/dev/null 2>&1 || { echo "install_llamacpp: $server does not run" >&2; exit 1; }
step "done in $((SECONDS - started)) s: $python ($(du -sh "$venv" | cut -f1); the wheel $(du -sh "$wheels" | cut -f1))"
