#!/usr/bin/env bash
# Run the CPU test suites that exercise the model, RL, stages, rollout, parallel layouts, the engines and the
# pipeline under another torch release than the project's venv (the GPU host's 2.11, say), with everything
# else from the venv: that torch goes into a folder of its own, first on PYTHONPATH.
#
#   bash bench/torch_versions.sh 2.11.0 [pytest args...]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${1:?usage: bash bench/torch_versions.sh TORCH_VERSION [pytest args]}"
shift
SITE="${TORCH_SITE:-$REPO/.cache/torch-$VERSION}"
PY="$REPO/.venv/bin/python"
if [ ! -d "$SITE/torch" ]; then
  "$PY" -m pip install --quiet --target "$SITE" "torch==$VERSION"
fi
cd "$REPO"
PYTHONPATH="$SITE" "$PY" -c 'import torch; print("torch", torch.__version__)'
PYTHONPATH="$SITE" "$PY" -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/model tests/rl tests/stages \
  tests/rollout tests/tokenizer tests/config tests/parallel tests/engines tests/pipeline tests/rollout_server "$@"
