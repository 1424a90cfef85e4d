#!/usr/bin/env bash
# The prepared GPU check: pretrain and RL steps of a small config on one CUDA device, fp32-islands vs
# bf16 (tokens/s, peak memory, ratio tail), then gap_checks.py (percentiles on the device, the bitwise
# deterministic mode on CUDA), then megatron_check.py (the megatron engine against the torch engine),
# then decode_graphs.py (decode tokens/s: eager with either decode cache, and a CUDA-graph step), then one
# JSON and one Markdown table of everything (summarize.py: $OUT/gpu.json, $OUT/gpu.md).
# Run from anywhere; it works on the repository it lives in.
#
#   bash bench/gpu/wheels.sh WHEELS                 # once, on a machine with the package index
#   bash bench/gpu/run.sh --wheels WHEELS           # on the GPU machine, offline; results in $OUT
#   bash bench/gpu/run.sh --smoke [--wheels WHEELS] # tiny sizes on the CPU: everything installs and runs
#
# No network is assumed. With --wheels, the wheels in that folder (bench/gpu/wheels.txt: what a GPU host
# with its own CUDA torch and scientific stack lacks) are installed with pip --no-index --no-deps into
# $OUT/site, which goes on PYTHONPATH after the repository: the host's torch and packages are never
# replaced. What is still missing is printed, and the script stops with status 3 before any work.
#
# Time: each phase has its own timeout, and they add up to the budget printed at the start (460 s, under
# 8 minutes). Environment: PYTHON (default: python3, else python), OUT (default ./bench-gpu-out),
# RINGZERO_GPU_TIMEOUT_S (the stage-steps phase, default 150; stage_steps.py starts no new case after its
# --budget-s, 120). Further arguments go to bench/gpu/stage_steps.py (see its --help).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
export OUT="${OUT:-$REPO/bench-gpu-out}"
mkdir -p "$OUT"
SMOKE=0
WHEELS=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --smoke) SMOKE=1; ARGS+=("$1"); shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
T_INSTALL=60 T_STEPS="${RINGZERO_GPU_TIMEOUT_S:-150}" T_GAP=60 T_MEGATRON=120 T_DECODE=60 T_SUMMARY=10
echo "time budget: $((T_INSTALL + T_STEPS + T_GAP + T_MEGATRON + T_DECODE + T_SUMMARY)) s (install $T_INSTALL, stage steps $T_STEPS, gap checks $T_GAP, megatron $T_MEGATRON, decode $T_DECODE, summary $T_SUMMARY)"

echo "== environment"
if [ -z "$PY" ] || ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
  echo "missing: Python >= 3.11 (got: ${PY:-none} $("${PY:-false}" --version 2>&1))"; exit 3
fi
"$PY" --version
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "$WHEELS" ]; then
  if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then echo "missing: wheels in $WHEELS (bash bench/gpu/wheels.sh $WHEELS)"; exit 3; fi
  rm -rf "$OUT/site"
  timeout --signal=TERM --kill-after=10 "$T_INSTALL" "$PY" -m pip install --quiet --no-index --no-deps \
    --disable-pip-version-check --target "$OUT/site" "$WHEELS"/*.whl || { echo "installing from $WHEELS failed"; exit 3; }
  echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $OUT/site"
  export PYTHONPATH="$REPO:$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi

# Every runtime dependency of pyproject.toml, by import name; torch first, with its CUDA build.
"$PY" - "$SMOKE" <<'PYEOF' || exit 3
import importlib.util, sys
smoke = sys.argv[1] == "1"
missing = [m for m in ("torch", "numpy", "yaml", "pydantic", "structlog", "safetensors", "rich", "minio",
                       "fastapi", "uvicorn", "requests", "tokenizers") if importlib.util.find_spec(m) is None]
if "torch" not in missing:
    import torch
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}"
          + (f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
    major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if major_minor < (2, 11):
        print(f"note: torch {torch.__version__} is older than the releases the CPU suites pass on "
              "(2.11 and 2.13: bash bench/torch_versions.sh VERSION)")
    if not smoke and not torch.cuda.is_available():
        print("missing: a CUDA device visible to torch (a CPU-only torch, or no driver); --smoke runs on the CPU")
        sys.exit(1)
if missing:
    print("missing Python packages (no network here, so nothing is fetched; bash bench/gpu/wheels.sh DIR on a "
          "machine with the index, then --wheels DIR): " + ", ".join(missing))
    sys.exit(1)
try:
    import ringzero.stages.rl_session, ringzero.stages.lm_step, ringzero.stages.corpus_windows  # noqa: F401
    import ringzero.config.loader, ringzero.store, ringzero.metrics  # noqa: F401
except ImportError as exc:
    print(f"ringzero does not import from {sys.path[0] or '.'}: {exc}")
    sys.exit(1)
print("imports: ok")
PYEOF

echo "== stage steps"
timeout --signal=TERM --kill-after=10 "$T_STEPS" "$PY" bench/gpu/stage_steps.py "${ARGS[@]}"
rc=$?
[ $rc -eq 124 ] && echo "stopped at $T_STEPS s; the finished cases are in $OUT"

echo "== gap checks (percentiles on the device, bitwise deterministic mode on CUDA)"
timeout --signal=TERM --kill-after=10 "$T_GAP" "$PY" bench/gpu/gap_checks.py "${ARGS[@]}"
gap_rc=$?
[ $rc -eq 0 ] && rc=$gap_rc

echo "== megatron engine (parity with the torch engine at TP 1, RL step speed of both engines)"
if "$PY" -c 'import megatron.core' 2>/dev/null; then
  timeout --signal=TERM --kill-after=10 "$T_MEGATRON" "$PY" bench/gpu/megatron_check.py "${ARGS[@]}"
  mc_rc=$?
  [ $rc -eq 0 ] && rc=$mc_rc
else
  echo "skipped: megatron-core is not installed here (it is in bench/gpu/wheels.txt: --wheels DIR)"
fi
echo "== decode tokens/s with and without CUDA graphs (static decode cache)"
# Only --smoke is passed on: the other arguments are stage_steps.py's (its --budget-s among them).
DG_SMOKE=""
[ $SMOKE -eq 1 ] && DG_SMOKE=--smoke
timeout --signal=TERM --kill-after=10 "$T_DECODE" "$PY" bench/gpu/decode_graphs.py $DG_SMOKE
dg_rc=$?
[ $dg_rc -eq 124 ] && echo "stopped at $T_DECODE s; the finished cases are in $OUT/decode_graphs.json"
[ $rc -eq 0 ] && rc=$dg_rc
echo "== summary"
timeout --signal=TERM --kill-after=5 "$T_SUMMARY" "$PY" bench/gpu/summarize.py "$OUT"
ls -l "$OUT"
exit $rc
