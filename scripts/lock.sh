#!/usr/bin/env bash
# Refresh constraints-test.txt, the versions `make test` / `make demo` install: a fresh virtualenv with
# the newest versions pyproject.toml allows (torch from constraints.txt), the test suite run in it, then
# its `pip freeze` (memrl itself and local version labels such as +cpu left out).
# Usage: bash scripts/lock.sh [venv dir] [extra pip options, e.g. --extra-index-url URL]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-lock}
shift || true
PYTHON=${PYTHON:-python3}
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "$@" -c constraints.txt torch
"$VENV/bin/pip" install -q "$@" -c constraints.txt -e '.[dev,docs]'
"$VENV/bin/ruff" check memrl tests benchmarks
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$VENV/site"
"$VENV/bin/pytest" -q tests --ignore=tests/vllm
{
  echo "# The versions CI tested: \`pip freeze\` of the test virtualenv (memrl itself left out), read by the"
  echo "# Makefile's install (make test, make demo) next to constraints.txt. Regenerate: \`make lock\` (README: Install)."
  "$VENV/bin/pip" freeze --exclude-editable | grep -v '^#' | grep -iv '^memrl' \
    | sed -E 's/^([A-Za-z0-9_.-]+==[^+]+)\+[A-Za-z0-9.]+$/\1/'
} > constraints-test.txt
echo "constraints-test.txt: $(grep -c '==' constraints-test.txt) pins from $VENV"
