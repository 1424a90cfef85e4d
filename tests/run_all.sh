#!/usr/bin/env bash
# Runs the whole suite: sets up the virtualenv, installs the system packages the tests need, starts
# loopback servers, runs pytest in parallel, and always stops the servers. Exits non-zero on any failure.
#
# The servers start while the virtualenv installs: neither needs the other (the start scripts use the
# system python3 and apt), and on a fresh machine each is a minute or more of downloads and unpacking.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
EXPORTS=$(mktemp "${TMPDIR:-/tmp}/ringzero-servers.XXXXXX")

cleanup() {
  # a start script still running (setup failed first) is stopped before what it started is
  [ -n "${STARTING:-}" ] && kill "$STARTING" 2>/dev/null && wait "$STARTING" 2>/dev/null
  # shellcheck disable=SC1090
  [ -s "$EXPORTS" ] && . "$EXPORTS" 2>/dev/null
  for stop in tests/servers/*-stop.sh; do [ -x "$stop" ] && "$stop" || true; done
  rm -f "$EXPORTS"
}
trap cleanup EXIT

# Each tests/servers/<name>-start.sh installs what it needs (idempotently), starts its server on
# 127.0.0.1 and prints `export VAR=value` lines the tests read to find it. They run one after another
# (two apt-get runs at once would fight over dpkg's lock), each appending to $EXPORTS as it finishes, so
# the cleanup finds whatever did start. A script that fails prints an *_ERROR export instead: the tests
# that need it fail with the reason, the others still run.
start_servers() {
  local start
  for start in tests/servers/*-start.sh; do
    [ -x "$start" ] || continue
    "$start" >>"$EXPORTS" || echo "run_all: $start failed (its tests will say why)" >&2
  done
}
start_servers &
STARTING=$!

"${MAKE:-make}" --no-print-directory setup
wait "$STARTING" || true
STARTING=
# shellcheck disable=SC1090
. "$EXPORTS"

"$BIN"/ruff check ringzero tests bench components pipelines
"$BIN"/ruff format --check --quiet ringzero tests bench components pipelines
# the 25 slowest tests after every run, so the next slowdown is seen
"$BIN"/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
