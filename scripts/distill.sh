#!/usr/bin/env bash
# The chain-of-thought distillation recipe end to end (DynaPix §5.1 applied to PSR):
#   predicates -> narration -> SFT sets -> train CoT, answer-only and trajectory-labels students -> forecast
#   (zero-shot base and the three students) -> retrieve -> eval report (comparison table + paired significance) ->
#   answer accuracy (exact and snapped, every pair) -> faithfulness.
# Every step is a package command (logged before it runs); the jobs resume, so rerunning continues where it stopped.
#
# GPU (student 8B, teacher Qwen3-32B through in-process vLLM):
#   bash scripts/distill.sh --data data/psr --out runs/distill-8b --preset configs/distill/qwen3-vl-8b.yaml \
#        --accelerate configs/accelerate/single_gpu.yaml
# CPU demo (tiny random Qwen3-VL, template narrator, a few QLoRA steps, a handful of test queries):
#   bash scripts/distill.sh --cpu-demo --out reports/distill-demo [--data data/psr-synth]
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/distill.sh [options]
  --data DIR             benchmark directory (required unless --cpu-demo, which builds a 40-video synthetic one)
  --out DIR              output directory                                   [runs/distill]
  --preset FILE          distillation preset (configs/distill/*.yaml)       [configs/distill/qwen3-vl-8b.yaml]
  --model ID|DIR         student base model (default: the preset's train.model)
  --accelerate FILE      accelerate config (configs/accelerate/*.yaml)      [configs/accelerate/single_gpu.yaml]
  --num-processes N      accelerate processes (GPUs)                        [the config's]
  --narrator NAME        teacher | template | template-noisy                [the preset's]
  --teacher-url URL      narrate through a served teacher (OpenAI-compatible, e.g. vllm serve Qwen/Qwen3-32B)
  --forecast-backend B   vllm | hf                                          [vllm]
  --space NAME           semantic retrieval space                           [bge]
  --space-model ID       its text encoder                                   [BAAI/bge-small-en-v1.5]
  --limit N              forecast only the first N test queries (smoke runs)
  --max-tokens N         student generation budget                          [512]
  --cpu-demo             tiny CPU variant: tiny Qwen3-VL, template narrator, packaged MiniLM space, hf backend
  --python PY            interpreter                                        [.venv/bin/python if present, else python]
EOF
}

PY=""; DATA=""; OUT="runs/distill"; PRESET="configs/distill/qwen3-vl-8b.yaml"; MODEL=""; ACCEL="configs/accelerate/single_gpu.yaml"
NPROC=""; NARRATOR=""; TEACHER_URL=""; FB="vllm"; SPACE="bge"; SPACE_MODEL="BAAI/bge-small-en-v1.5"; LIMIT=""
MAX_TOKENS="512"; DEMO=0; SFT_LIMIT=(); FAITH_LIMIT=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) DATA="$2"; shift 2;;
    --out) OUT="$2"; shift 2;;
    --preset) PRESET="$2"; shift 2;;
    --model) MODEL="$2"; shift 2;;
    --accelerate) ACCEL="$2"; shift 2;;
    --num-processes) NPROC="$2"; shift 2;;
    --narrator) NARRATOR="$2"; shift 2;;
    --teacher-url) TEACHER_URL="$2"; shift 2;;
    --forecast-backend) FB="$2"; shift 2;;
    --space) SPACE="$2"; shift 2;;
    --space-model) SPACE_MODEL="$2"; shift 2;;
    --limit) LIMIT="$2"; shift 2;;
    --max-tokens) MAX_TOKENS="$2"; shift 2;;
    --cpu-demo) DEMO=1; shift;;
    --python) PY="$2"; shift 2;;
    -h|--help) usage; exit 0;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2;;
  esac
done
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-0}" TOKENIZERS_PARALLELISM=false

run() { echo; echo "\$ $*"; local t0=$SECONDS; "$@"; echo "  ($((SECONDS - t0)) s)"; }

mkdir -p "$OUT"
T_START=$SECONDS
if [[ $DEMO == 1 ]]; then
  # Tiny CPU variant: everything local and offline; numbers are plumbing checks, not results.
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  # tiny models run fastest on one thread (two threads contend on small, busy CPUs)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
  # template-noisy: the template narrator with injected teacher mistakes, so the validator's rejects show
  PRESET="configs/distill/tiny-cpu.yaml"; NARRATOR="template-noisy"; FB="hf"; SPACE="minilm"
  SPACE_MODEL="packaged:all-MiniLM-L6-v2"; LIMIT="${LIMIT:-8}"; MAX_TOKENS="48"
  if [[ -z "$DATA" ]]; then
    DATA="$OUT/psr-synth"
    [[ -f "$DATA/manifest.json" ]] || run "$PY" -m eval synth --out "$DATA" --videos 40 --seed 0 --workers 1
  fi
  if [[ -z "$MODEL" ]]; then
    MODEL="$OUT/tiny-qwen3-vl"
    [[ -f "$MODEL/config.json" ]] || run "$PY" -m forecasters tiny-model --kind qwen3_vl --out "$MODEL"
  fi
  TRAIN=("$PY" -m distill.train --max_steps 8)
  SFT_LIMIT=(--limit 32 --eval-limit 8); FAITH_LIMIT=(--limit 24)   # 24 test queries, stratified over the test videos
else
  TRAIN=(accelerate launch --config_file "$ACCEL")
  [[ -n "$NPROC" ]] && TRAIN+=(--num_processes "$NPROC")
  TRAIN+=(-m distill.train)
fi
[[ -n "$DATA" ]] || { echo "--data is required" >&2; usage >&2; exit 2; }
cfg() { "$PY" -m distill config-get --config "$PRESET" --section "$1" --key "$2"; }
[[ -n "$MODEL" ]] || MODEL="$(cfg train model_name_or_path)"
FRAMES="$(cfg sft frames)"; MAX_PIXELS="$(cfg sft max_pixels)"
NARRATE=(--config "$PRESET" --data "$DATA" --predicates "$OUT/predicates.jsonl")
[[ -n "$NARRATOR" ]] && NARRATE+=(--narrator "$NARRATOR")
[[ -n "$TEACHER_URL" ]] && NARRATE+=(--backend openai --base-url "$TEACHER_URL")
LIMIT_ARGS=(); [[ -n "$LIMIT" ]] && LIMIT_ARGS=(--limit "$LIMIT")

# 1. oracle -> predicates (every split: train for SFT, test for the faithfulness check)
run "$PY" -m distill predicates --config "$PRESET" --data "$DATA" --out "$OUT/predicates.jsonl"
# 2. narration: the teacher (or the template narrator) phrases the train predicates; every output is validated
run "$PY" -m distill narrate "${NARRATE[@]}" --split train --out "$OUT/rationales"
#    the validation split, narrated the same way: eval loss and answer accuracy of the students during training
run "$PY" -m distill narrate "${NARRATE[@]}" --split val --out "$OUT/rationales-val"
#    rationales of test queries (deterministic template narrator): the test side of the leakage probe
run "$PY" -m distill narrate --config "$PRESET" --data "$DATA" --predicates "$OUT/predicates.jsonl" \
    --narrator template --split test --out "$OUT/rationales-test"
#    answer restatements, leakage probes (string match, classifier), validator rejects, and (synthetic benchmark)
#    the validator's false rejections of honest free-word descriptions of the truth, with its leak control
run "$PY" -m distill rationale-stats --data "$DATA" --rationales "$OUT/rationales" "$OUT/rationales-test" \
    --predicates "$OUT/predicates.jsonl" --out "$OUT/rationale-stats" > /dev/null
# 3. SFT sets (Parquet): CoT, answer-only and trajectory-labels, same queries and prompts, train + validation splits
#    (skipped when built; delete $OUT/sft to rebuild)
[[ -f "$OUT/sft/sft.summary.json" ]] || \
  run "$PY" -m distill sft --config "$PRESET" --data "$DATA" --rationales "$OUT/rationales" \
      --eval-rationales "$OUT/rationales-val" --out "$OUT/sft" "${SFT_LIMIT[@]}"
# 4. students: LoRA on a 4-bit base, one per variant, at the preset's effective batch on any number of processes
#    (an interrupted run resumes from its newest checkpoint of the same config; a finished one is skipped)
for V in cot answer trajectory; do
  [[ -f "$OUT/students/$V/adapter/adapter_config.json" ]] || \
    run "${TRAIN[@]}" --config "$PRESET" --model_name_or_path "$MODEL" --dataset_name "$OUT/sft/$V" \
        --output_dir "$OUT/students/$V"
done
# 5. forecast the test split: zero-shot base (same prompt, no adapter), answer-only, trajectory-labels and CoT
#    students (an adapter carries its frames and pixel cap; the values passed here must agree with them).
#    The vllm backend runs in vLLM's own venv (scripts/install_vllm.sh [--gpu]; VLLM_PY overrides) with this repo on
#    PYTHONPATH: vLLM pins an older transformers than the toolkit's.
FPY="$PY"
if [[ "$FB" == vllm ]]; then
  FPY=${VLLM_PY:-.venv-vllm/bin/python}
  [[ -x "$FPY" ]] || { echo "--forecast-backend vllm needs vLLM's venv at $FPY: run scripts/install_vllm.sh --gpu" >&2; exit 2; }
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
declare -A ADAPTER=([zero-shot]="" [answer-only]="$OUT/students/answer/adapter"
                    [trajectory-labels]="$OUT/students/trajectory/adapter" [cot]="$OUT/students/cot/adapter")
METHODS=(zero-shot answer-only trajectory-labels cot)
for NAME in "${METHODS[@]}"; do
  A=(); [[ -n "${ADAPTER[$NAME]}" ]] && A=(--adapter "${ADAPTER[$NAME]}")
  run "$FPY" -m forecasters run --data "$DATA" --split test --forecaster student --backend "$FB" --model "$MODEL" \
      "${A[@]}" --frames "spaced:$FRAMES" --max-pixels "$MAX_PIXELS" --max-tokens "$MAX_TOKENS" "${LIMIT_ARGS[@]}" \
      --out "$OUT/phrases/$NAME.jsonl" --no-progress
done
# 6. retrieve: embed each phrase file in the semantic space, rank the corpus
[[ -f "$DATA/features/$SPACE/meta.json" ]] || \
  run "$PY" -m retrieval encode --data "$DATA" --space "$SPACE" --model "$SPACE_MODEL" --kind semantic
for NAME in "${METHODS[@]}"; do
  run "$PY" -m retrieval search --data "$DATA" --phrases "$OUT/phrases/$NAME.jsonl" --space "$SPACE" --split test \
      --method "$NAME" --out "$OUT/runs/$NAME.parquet"
  #  the snap read of the answers table: each phrase snapped to its nearest canonical state
  run "$PY" -m retrieval search --data "$DATA" --phrases "$OUT/phrases/$NAME.jsonl" --space "$SPACE" --split test \
      --method "$NAME+snap" --canonicalize 1 --out "$OUT/runs/$NAME+snap.parquet"
done
# 7. evaluate: the comparison table with paired significance vs the zero-shot base, and vs the answer-only control
#    (retrieval names a run METHOD[SPACE])
RUNS=(); PHRASES=(); SNAPS=()
for NAME in "${METHODS[@]}"; do
  RUNS+=("$OUT/runs/$NAME.parquet"); PHRASES+=("$OUT/phrases/$NAME.jsonl"); SNAPS+=("$NAME=$OUT/runs/$NAME+snap.parquet")
done
run "$PY" -m eval report "${RUNS[@]}" --data "$DATA" --out "$OUT/report" --reference "zero-shot[$SPACE]"
run "$PY" -m eval report "${RUNS[@]:1}" --data "$DATA" --out "$OUT/report-cot-vs-answer-only" \
    --reference "answer-only[$SPACE]"
#    answer accuracy, exact and snapped, every pair (cot vs trajectory-labels vs answer-only) with a bootstrap by video
run "$PY" -m distill answers --data "$DATA" --out "$OUT/answers" --phrases "${PHRASES[@]}" \
    --names "${METHODS[@]}" --snap-runs "${SNAPS[@]}"
# 8. faithfulness of the CoT student (SCOTT-style: counterfactual evidence, does the answer move to it?)
run "$PY" -m distill faithfulness --config "$PRESET" --data "$DATA" --model "$MODEL" \
    --adapter "$OUT/students/cot/adapter" --predicates "$OUT/predicates.jsonl" --out "$OUT/faithfulness" \
    "${FAITH_LIMIT[@]}"

echo; echo "== comparison (retrieval, $SPACE space) =="; cat "$OUT/report/main.md"
[[ -f "$OUT/report/significance.md" ]] && cat "$OUT/report/significance.md"
[[ -f "$OUT/report-cot-vs-answer-only/significance.md" ]] && cat "$OUT/report-cot-vs-answer-only/significance.md"
echo; echo "== answer accuracy =="; cat "$OUT/answers/answers.md"
echo; echo "== rationales and validator =="; cat "$OUT/rationale-stats/rationale_stats.md"
echo; echo "== faithfulness =="; cat "$OUT/faithfulness/faithfulness.md"
echo; echo "distill recipe done in $((SECONDS - T_START)) s: $OUT"
