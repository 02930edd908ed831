#!/usr/bin/env bash
# The GPU run, ready to go (issue 15 item 6): our training step vs HF BertForMaskedLM (SDPA), base size, bf16,
# seq 128 and 512, torch.compile on and off; tokens/s and MFU vs the device's bf16 peak. Under 5 minutes of
# device time: the Python side stops starting new variants after --budget-s (240 s) and the whole run is cut at
# 290 s; results are rewritten after every variant, so a cut run still leaves them.
#
#   bash benchmarks/gpu.sh                 # on the CUDA machine -> bench-out/gpu/gpu_results.{md,json}
#   bash benchmarks/gpu.sh --dry-run       # CPU, tiny model, no compile: the same code path in seconds
#   bash benchmarks/gpu.sh --dry-run --with-compile     # ... with the compiled rows (~2 min on 2 CPU cores)
#   PY=/path/to/python OUT=dir bash benchmarks/gpu.sh --peak-tflops 989   # extra flags go to gpu_bench.py
#
# Needs a Python with torch (CUDA build), transformers, numpy and pydantic; the repository is used in place
# (PYTHONPATH), nothing is installed or downloaded (the model is built from its config, the data synthesized).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=$(command -v python3 || command -v python); fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-bench-out/gpu}

# prepare: the interpreter has what the benchmark imports (a clear message instead of a traceback)
"$PY" - <<'PYEOF'
import importlib, sys
missing = [m for m in ("torch", "transformers", "numpy", "pydantic") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu.sh: {sys.executable} lacks {', '.join(missing)}: set PY=<a python with them>")
import torch
print(f"gpu.sh: {sys.executable}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"devices {torch.cuda.device_count()}", flush=True)
PYEOF

if [[ "${1:-}" == "--dry-run" ]]; then
  shift
  exec timeout 600 "$PY" benchmarks/gpu_bench.py --device cpu --tiny --out "$OUT-dry-run" "$@"
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu.sh: no CUDA device visible (torch.cuda.is_available() is False); for the CPU check: $0 --dry-run" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version \
  --format=csv,noheader || true
timeout 290 "$PY" benchmarks/gpu_bench.py --device cuda --size base --dtype bf16 --seqs 128,512 \
  --budget-s 240 --out "$OUT" "$@" || echo "gpu.sh: stopped early (rc=$?); partial results: $OUT/gpu_results.md" >&2
cat "$OUT/gpu_results.md"
