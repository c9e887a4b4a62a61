#!/usr/bin/env bash
# The one prepared check for a machine with one CUDA device (an H100 or H200 with torch, transformers and
# peft; no vLLM, no Ray), inside 10 minutes: the gpu-marked tests, benchmarks/gpu_single.py, one MemAgent
# GRPO and one MemAct DCPO step on 0.5B-shaped random models (Qwen2, Qwen3) in bf16, and the long-row
# memory benchmark; one table at the end (benchmarks/gpu_check.py says what each section runs).
#
#   bash scripts/gpu_check.sh [--out runs/gpu_check] [--only tests,steps] [--dry-run]
#
# PYTHON: the interpreter (default python3). MEMRL_WHEELS=DIR: first install the wheels in DIR offline into
# a temporary folder put ahead on PYTHONPATH, for a machine that lacks memrl's other dependencies
# (omegaconf, hydra-core, antlr4-python3-runtime, bm25s, a transformers that memrl supports); docs/guides/scaleout.md
# shows how to download them on a machine with an index. --dry-run: every section on the CPU at toy sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${MEMRL_WHEELS:-}" ]; then
  site="$(mktemp -d)/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$MEMRL_WHEELS"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" benchmarks/gpu_check.py "$@"
