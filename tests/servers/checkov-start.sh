#!/usr/bin/env bash
# Makes the Checkov policy scanner available for the chart's policy test: a virtualenv of its own under
# .cache/checkov (Checkov pins packaging, boto3 and networkx versions the project's own environment
# cannot share). No server is started.
#
# stdout carries only `export VAR=value` lines for the test runner to eval: RINGZERO_CHECKOV, the
# scanner's path. If it cannot be installed, stdout carries `export RINGZERO_CHECKOV_ERROR=...` instead
# and the script exits non-zero, so the policy test fails with the reason rather than skips.
# Everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=3.3.30  # keep in step with CHECKOV_VERSION in tests/cluster/test_cluster_chart_policy.py
ENV_DIR=.cache/checkov
log() { echo "checkov-start: $*" >&2; }
fail() {
  log "FAILED: $*"
  printf 'export RINGZERO_CHECKOV_ERROR=%q\n' "Checkov is not available: $*"
  exit 1
}
# shellcheck source=start_kit.sh
. tests/servers/start_kit.sh

if ! "$ENV_DIR/bin/checkov" --version 2>/dev/null | grep -qx "$VERSION"; then
  log "installing checkov $VERSION into $ENV_DIR"
  python3 -m venv "$ENV_DIR" >&2 || fail "python3 -m venv $ENV_DIR failed"
  "$ENV_DIR/bin/pip" install -q "checkov==$VERSION" >&2 || fail "pip install checkov==$VERSION failed"
fi
printf 'export RINGZERO_CHECKOV=%q\n' "$PWD/$ENV_DIR/bin/checkov"
