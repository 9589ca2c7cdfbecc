#!/usr/bin/env bash
# M3 (the paper's multimodal-LLM baseline) on a GPU node with vLLM: Qwen3-VL-32B-Instruct sees the 8 prefix frames
# and the question (verbatim prompt), greedy decoding, 24 tokens; one phrase-file line per test query.
#
#   scripts/run_m3.sh DATA [OUT_DIR] [SHARD_I SHARD_N]
#
#   scripts/run_m3.sh data/psr runs/m3                 # one node, all test queries  -> runs/m3/m3.jsonl
#   scripts/run_m3.sh data/psr runs/m3 0 4             # node 0 of 4                 -> runs/m3/m3.shard0-of-4.jsonl
#   ... nodes 1..3 likewise, then on any machine:
#   python -m forecasters merge runs/m3/m3.shard*-of-4.jsonl --out runs/m3/m3.jsonl --data data/psr --require-complete
#
# Shards split by prefix (a prefix never spans two nodes), each shard file is resumable: rerun the same command after
# a crash or preemption. Env: PY (python with vllm; default .venv-vllm/bin/python, built by
# `scripts/install_vllm.sh --gpu`, with this repository on PYTHONPATH), TP (tensor parallel, default 2: 32B in bf16 on 2x80 GB),
# MODEL (default the m3 preset), EXTRA (more `forecasters run` options, e.g. "--frames 4").
# Exit code 0 when every query of the shard has an answer; 3 when some failed or are missing (the message prints the
# command that finishes the shard).
set -euo pipefail
DATA=${1:?usage: scripts/run_m3.sh DATA [OUT_DIR] [SHARD_I SHARD_N]}
OUT=${2:-runs/m3}
I=${3:-0}
N=${4:-1}
REPO=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${PY:-}" ] && [ -x "$REPO/.venv-vllm/bin/python" ]; then PY="$REPO/.venv-vllm/bin/python"; fi
PY=${PY:-python}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
if [ "$N" = 1 ]; then FILE="$OUT/m3.jsonl"; else FILE="$OUT/m3.shard$I-of-$N.jsonl"; fi
# shellcheck disable=SC2086
exec "$PY" -m forecasters run --data "$DATA" --split test --forecaster m3 --backend vllm --model "${MODEL:-m3}" \
  --tensor-parallel-size "${TP:-2}" --shard "$I/$N" --out "$FILE" ${EXTRA:-}
