#!/usr/bin/env bash
# Plumbing check of the forecaster path, end to end on CPU: build a tiny model locally (briefly fit on the synthetic
# train split so it answers with state phrases; a progress bar shows the fit), run the text-only forecaster over the
# synthetic test split through the hf backend, retrieve with its phrases in the MiniLM text space, score the run
# with the evaluator. The tiny model is a plumbing check, not a baseline: its numbers say nothing about forecasting.
#   scripts/forecaster_demo.sh [DATA] [OUT]       (defaults: data/psr-synth reports/demo/forecaster in the repository)
# DATA and OUT given as relative paths are taken from the directory you run the script in.
# Env: PY (python, default the repository's .venv/bin/python), LIMIT (queries, default all of the test split),
# STEPS (fit steps, default 100).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
from_caller() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }
DATA=$(from_caller "${1:-$REPO/data/psr-synth}")
OUT=$(from_caller "${2:-$REPO/reports/demo/forecaster}")
PY=${PY:-$REPO/.venv/bin/python}
[[ "$PY" == */* ]] && PY=$(from_caller "$PY")
cd "$REPO"
mkdir -p "$OUT"
[ -f "$DATA/manifest.json" ] || "$PY" -m eval synth --out "$DATA"
[ -f "$DATA/features/minilm/meta.json" ] || "$PY" -m retrieval encode --data "$DATA" --space minilm --model packaged:all-MiniLM-L6-v2
[ -f "$OUT/tiny-qwen2/config.json" ] || "$PY" -m forecasters tiny-model --out "$OUT/tiny-qwen2" --kind qwen2 --fit-data "$DATA" --fit-steps "${STEPS:-100}"
"$PY" -m forecasters run --data "$DATA" --split test --forecaster text-only --backend hf --model "$OUT/tiny-qwen2" \
  --out "$OUT/text-only-tiny.jsonl" --num-threads 1 ${LIMIT:+--limit "$LIMIT"}
"$PY" -m retrieval search --data "$DATA" --phrases "$OUT/text-only-tiny.jsonl" --space minilm --out "$OUT/text-only-tiny.parquet"
"$PY" -m eval score --data "$DATA" --run "$OUT/text-only-tiny.parquet" --out "$OUT/score"
echo "forecaster plumbing check done: $OUT (phrases, run, score/)"
