#!/usr/bin/env bash
# Issue 21 item 4: the primary contrasts of the six experiment sweeps again, at a larger size, on a GPU, within
# 8 minutes of device time. Each sweep file is run as it ships (its variants, its 6 seeds on the primary
# contrasts) with the same --set words on every run, into its own workdir, then `mlm report` rebuilds its report
# (verdicts, controls) from the stored outputs. Sweeps run in the order below until the time is spent; a sweep cut
# by the clock keeps its finished runs, and its report lists the missing ones as missing.
#
#   bash benchmarks/experiments_gpu.sh              # on the CUDA machine -> bench-out/experiments-gpu/<sweep>/
#   bash benchmarks/experiments_gpu.sh --dry-run    # CPU: every sweep planned with the GPU words (no training)
#   BUDGET_S=900 bash benchmarks/experiments_gpu.sh # more device time
#
# Size on the GPU (against configs/experiments/base.yaml's CPU size: 4 x 128 wide, 600 steps x 32 sequences):
# the `small` shape (4 layers, width 256, 4 heads), 1500 steps x 64 sequences of 128 tokens (~12M tokens, ~5
# passes over the 7-language text), warm-up 150; device and bf16 come from `auto`. The tables go beside the CPU
# ones in docs/EXPERIMENTS.md, labelled with the device this script prints (DEVICE.txt in each report folder).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
MLM=${MLM:-$REPO/.venv/bin/mlm}
[[ -x "$MLM" ]] || MLM=$(command -v mlm || true)
[[ -n "$MLM" ]] || { echo "experiments_gpu.sh: no mlm executable (make setup, or MLM=/path/to/mlm)" >&2; exit 2; }
export HF_HUB_OFFLINE=1 PREFECT_SERVER_ANALYTICS_ENABLED=false MLFLOW_DISABLE_TELEMETRY=true GX_ANALYTICS_ENABLED=false
OUT=${OUT:-$REPO/bench-out/experiments-gpu}
BUDGET_S=${BUDGET_S:-450}          # leaves a margin under 8 minutes for start-up and the reports
SWEEPS=(masking_rate masking_strategy temperature masking_schedule electra_vs_mlm bias_mitigation)
WORDS=(--set "workdir=$OUT/work" --set pretrain.model.size=small --set pretrain.steps=1500
       --set pretrain.batch_size=64 --set pretrain.warmup_steps=150 --set pretrain.eval_every=500
       --set pretrain.checkpoint_every=500)

if [[ "${1:-}" == "--dry-run" ]]; then
  for s in "${SWEEPS[@]}"; do
    echo "== $s"
    "$MLM" sweep "configs/experiments/$s.yaml" --dry-run "${WORDS[@]}"
  done
  exit 0
fi
PY=$(dirname "$MLM")/python
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "experiments_gpu.sh: no CUDA device visible (torch.cuda.is_available() is False); on the CPU: $0 --dry-run" >&2
  exit 2
fi
DEVICE=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || \
         "$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
echo "experiments_gpu.sh: device $DEVICE, budget ${BUDGET_S}s"
mkdir -p "$OUT"
start=$(date +%s)
for s in "${SWEEPS[@]}"; do
  left=$(( BUDGET_S - ($(date +%s) - start) ))
  (( left > 30 )) || { echo "experiments_gpu.sh: time spent; not started: $s and after"; break; }
  echo "== $s (${left}s left)"
  timeout "$left" "$MLM" sweep "configs/experiments/$s.yaml" "${WORDS[@]}" > "$OUT/$s.log" 2>&1 \
    || echo "experiments_gpu.sh: $s stopped (rc=$?): its report lists the runs it did not finish"
  "$MLM" report "configs/experiments/$s.yaml" "${WORDS[@]}" >> "$OUT/$s.log" 2>&1 || true
  name=$(sed -n 's/^name: *//p' "configs/experiments/$s.yaml")
  if [[ -d "$OUT/work/sweeps/$name/report" ]]; then
    rm -rf "$OUT/$s"; cp -r "$OUT/work/sweeps/$name/report" "$OUT/$s"
    echo "$DEVICE; $(date -u +%FT%TZ); ${WORDS[*]}" > "$OUT/$s/DEVICE.txt"
    sed -n '/Verdict/,/^$/p' "$OUT/$s/report.md" | head -20
  fi
done
echo "experiments_gpu.sh: $(( $(date +%s) - start ))s; reports under $OUT/<sweep>/report.md"
