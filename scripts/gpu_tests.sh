#!/usr/bin/env bash
# Run the CUDA-only tests (tests/gpu/) on a GPU node. They skip without CUDA, so a clean run elsewhere proves nothing:
# this script refuses to run when torch sees no GPU.
#   pip install -c constraints-cpu.txt -e '.[gpu,dev]'     # once, in the venv you run this from (vllm with CUDA)
#   scripts/gpu_tests.sh                                   # PY=/path/to/python to pick the interpreter
#   PSR_GPU_MODEL=/models/Qwen3-VL-2B-Instruct scripts/gpu_tests.sh   # also a real-model check of M3's prompt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_tests.sh: torch sees no CUDA device; run this on a GPU node")
print("CUDA devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
try:
    import vllm
    print("vllm", vllm.__version__)
except ImportError:
    print("vllm not installed: the vllm tests will skip (pip install -e '.[gpu]')")
PYEOF
exec "$PY" -m pytest -q -rs tests/gpu "$@"
