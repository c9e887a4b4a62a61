#!/usr/bin/env bash
# Install TRL into its own virtualenv, for benchmarks/vs_trl.py (TRL is not a memrl dependency).
# Usage: bash scripts/install_trl.sh [VENV]   (default .venv-trl; idempotent: a finished install is kept)
# torch is pinned by constraints.txt (the CPU build), transformers to the version memrl's own venv runs, so both
# sides of the comparison run the same torch and transformers. TRL_VERSION=1.16.0 is the one measured.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-trl}"
PYTHON="${PYTHON:-python3}"
TRL_VERSION="${TRL_VERSION:-1.16.0}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-$(.venv/bin/python -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)}"
STAMP="$VENV/.trl-installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt constraints.txt ]; then
  echo "trl already installed in $VENV"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_q() { "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# torch first and pinned: never let a resolver pull the CUDA build.
pip_q install -q -c constraints.txt torch
pip_q install -q -c constraints.txt "transformers==$TRANSFORMERS_VERSION" "trl==$TRL_VERSION"
"$VENV/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
touch "$STAMP"
