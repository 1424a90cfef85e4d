#!/usr/bin/env bash
# Makes headless Chromium available for the report-rendering test: installs Debian's `chromium`
# package when it is missing. No server is started; the test launches its own short-lived browser.
#
# stdout carries only `export VAR=value` lines for the test runner to eval: RINGZERO_CHROMIUM, the
# browser binary. If it cannot be installed, stdout carries `export RINGZERO_CHROMIUM_ERROR=...`
# instead and the script exits non-zero, so the render test fails with the reason rather than skips.
# Everything else goes to stderr.
set -euo pipefail

log() { echo "chromium-start: $*" >&2; }
fail() {
  log "FAILED: $*"
  printf 'export RINGZERO_CHROMIUM_ERROR=%q\n' "chromium is not available: $*"
  exit 1
}
# shellcheck source=start_kit.sh
. "$(dirname "$0")/start_kit.sh"

find_browser() {
  for name in chromium chromium-browser; do
    command -v "$name" 2>/dev/null && return 0
  done
  return 1
}

if ! BROWSER=$(find_browser); then
  need_packages chromium
  BROWSER=$(find_browser) || fail "chromium installed but no chromium binary on PATH"
fi

"$BROWSER" --version >&2 || fail "$BROWSER --version failed"
printf 'export RINGZERO_CHROMIUM=%q\n' "$BROWSER"
