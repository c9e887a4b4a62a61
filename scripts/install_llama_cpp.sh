#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp's Python binding) from the package index's source package into its own
# virtualenv, for benchmarks/engine_compare.py's `llama` engine.
# Usage: bash scripts/install_llama_cpp.sh [VENV]   (default .venv-llama; idempotent: a finished install is kept)
# The build compiles llama.cpp for this CPU (GGML_NATIVE: every ISA extension the build machine has, e.g.
# AVX2/FMA/F16C, AVX-512, AMX), so the venv belongs to the machine that built it. It takes minutes on 2 cores.
# Extra cmake flags: CMAKE_ARGS="..." bash scripts/install_llama_cpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-llama}"
PYTHON="${PYTHON:-python3}"
# Pinned: the release the engine comparison was measured with (docs/results/engine.md).
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
STAMP="$VENV/.llama-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt constraints.txt ] && [ "$STAMP" -nt "$0" ]; then
  echo "llama-cpp-python already installed in $VENV"
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip's exit status is kept; only this machine's noise about absent local index folders is dropped.
pip_q() { "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# The source package (--no-binary), never a prebuilt wheel: a wheel built elsewhere targets another CPU.
# BLAS off: ggml's own kernels are what the comparison measures; tests, examples, server and the multimodal
# library (LLAVA_BUILD) are not needed.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
pip_q install -q --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
# The benchmark's worker drives llama.cpp from memrl's MemAgent runtime: memrl itself, torch pinned to the
# CPU build (never let a resolver pull the CUDA one).
pip_q install -q -c constraints.txt torch
pip_q install -q -c constraints.txt -e .
# psutil: benchmarks/engine_compare.py's CPU seconds per token (without it the llama rows have none).
pip_q install -q psutil
"$VENV/bin/python" - <<'PY'
import llama_cpp
print("llama-cpp-python", llama_cpp.__version__)
print("llama.cpp system info:", llama_cpp.llama_print_system_info().decode())
PY
touch "$STAMP"
echo "llama-cpp-python install took $(( $(date +%s) - start ))s"
