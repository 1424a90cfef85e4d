#!/usr/bin/env bash
# Runs the whole suite: installs system packages the tests need, starts loopback servers,
# runs pytest in parallel, and always stops the servers. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

cleanup() {
  for stop in tests/servers/*-stop.sh; do [ -x "$stop" ] && "$stop" || true; done
}
trap cleanup EXIT

# Each tests/servers/<name>-start.sh installs what it needs (idempotently), starts its server on
# 127.0.0.1 and prints `export VAR=value` lines the tests read to find it.
for start in tests/servers/*-start.sh; do
  [ -x "$start" ] || continue
  eval "$("$start")"
done

"$BIN"/ruff check ringzero tests bench components pipelines
# the 25 slowest tests after every run, so the next slowdown is seen
"$BIN"/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
