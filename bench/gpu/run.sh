#!/usr/bin/env bash
# The prepared GPU check: pretrain and RL steps of a small config on one CUDA device, fp32-islands vs
# bf16 (tokens/s, peak memory, ratio tail), then gap_checks.py (percentiles on the device, the bitwise
# deterministic mode on CUDA), then megatron_check.py (the megatron engine against the torch engine),
# then decode_graphs.py (decode tokens/s: eager with either decode cache, and a CUDA-graph step).
# Run from anywhere; it works on the repository it lives in.
#
#   bash bench/gpu/run.sh              # on the GPU machine; results in $OUT (else ./bench-gpu-out)
#   bash bench/gpu/run.sh --smoke      # tiny sizes on the CPU: a check that everything imports and runs
#
# No network is assumed: nothing is downloaded or installed and no virtualenv is created. The
# machine's own Python must already have torch with CUDA and ringzero's runtime dependencies; the
# repository is put on PYTHONPATH (an editable install would need setuptools from an index). What is
# missing is printed, and the script stops with status 3 before any work.
#
# Environment: PYTHON (default: python3, else python), OUT, RINGZERO_GPU_TIMEOUT_S (default 290: the
# whole run stays under 5 minutes; stage_steps.py starts no new phase after its --budget-s 240).
# Further arguments go to bench/gpu/stage_steps.py (see its --help).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-$REPO/bench-gpu-out}"
mkdir -p "$OUT"
SMOKE=0
for a in "$@"; do [ "$a" = "--smoke" ] && SMOKE=1; done

echo "== environment"
if [ -z "$PY" ] || ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "missing: Python >= 3.11 (got: ${PY:-none} $("${PY:-false}" --version 2>&1))"; exit 3
fi
"$PY" --version
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# Every runtime dependency of pyproject.toml, by import name; torch first, with its CUDA build.
"$PY" - "$SMOKE" <<'PYEOF' || exit 3
import importlib.util, sys
smoke = sys.argv[1] == "1"
missing = [m for m in ("torch", "numpy", "yaml", "pydantic", "structlog", "safetensors", "rich", "minio",
                       "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
if "torch" not in missing:
    import torch
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}"
          + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
    if not smoke and not torch.cuda.is_available():
        print("missing: a CUDA device visible to torch (a CPU-only torch, or no driver); --smoke runs on the CPU")
        sys.exit(1)
if missing:
    print("missing Python packages (no network here, so nothing is installed): " + ", ".join(missing))
try:
    import ringzero.stages.rl_session, ringzero.stages.lm_step, ringzero.stages.corpus_windows  # noqa: F401
    import ringzero.config.loader, ringzero.store, ringzero.metrics  # noqa: F401
except ImportError as exc:
    print(f"ringzero does not import from {sys.path[0] or '.'}: {exc}")
    sys.exit(1)
print("imports: ok" + (" (the missing packages above are not on this benchmark's path)" if missing else ""))
PYEOF

echo "== stage steps"
timeout --signal=TERM --kill-after=10 "${RINGZERO_GPU_TIMEOUT_S:-290}" "$PY" bench/gpu/stage_steps.py "$@"
rc=$?
[ $rc -eq 124 ] && echo "stopped at ${RINGZERO_GPU_TIMEOUT_S:-290} s; the finished cases are in $OUT"

echo "== gap checks (percentiles on the device, bitwise deterministic mode on CUDA)"
timeout --signal=TERM --kill-after=10 120 "$PY" bench/gpu/gap_checks.py "$@"
gap_rc=$?
[ $rc -eq 0 ] && rc=$gap_rc

echo "== megatron engine (parity with the torch engine at TP 1, RL step speed of both engines)"
if "$PY" -c 'import megatron.core' 2>/dev/null; then
  timeout --signal=TERM --kill-after=10 150 "$PY" bench/gpu/megatron_check.py "$@"
  mc_rc=$?
  [ $rc -eq 0 ] && rc=$mc_rc
else
  echo "skipped: megatron-core is not installed here (pip install 'megatron-core==0.16.1' einops)"
fi
echo "== decode tokens/s with and without CUDA graphs (static decode cache)"
# Only --smoke is passed on: the other arguments are stage_steps.py's (its --budget-s among them).
DG_SMOKE=""
[ $SMOKE -eq 1 ] && DG_SMOKE=--smoke
timeout --signal=TERM --kill-after=10 90 "$PY" bench/gpu/decode_graphs.py $DG_SMOKE
dg_rc=$?
[ $dg_rc -eq 124 ] && echo "stopped at 90 s; the finished cases are in $OUT/decode_graphs.json"
[ $rc -eq 0 ] && rc=$dg_rc
ls -l "$OUT"
exit $rc
