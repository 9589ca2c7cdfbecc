#!/usr/bin/env bash
# Launcher of the distillation recipe, `python -m distill recipe` (distill/recipe.py; manual: distill/README.md).
# Every flag is the recipe's (`python -m distill recipe --help`; --num-processes and --num_processes are the same).
#
# GPU (student 8B, teacher Qwen3-32B through in-process vLLM):
#   bash scripts/distill.sh --data data/psr --out runs/distill-8b --config configs/distill/qwen3-vl-8b.yaml \
#        --accelerate configs/accelerate/single_gpu.yaml
# CPU demo (tiny random Qwen3-VL, template narrator, a few QLoRA steps, a handful of test queries):
#   bash scripts/distill.sh --cpu-demo --out reports/distill-demo [--data data/psr-synth]
#
# --python PY: the interpreter of the recipe and its stages [.venv/bin/python if present, else python].
set -euo pipefail

PY=""
ARGS=("$@")
for ((i = 0; i < ${#ARGS[@]}; i++)); do
  case "${ARGS[i]}" in
    --python) PY="${ARGS[i + 1]:-}";;
    --python=*) PY="${ARGS[i]#--python=}";;
  esac
done
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
fi
exec "$PY" -m distill recipe "$@"
