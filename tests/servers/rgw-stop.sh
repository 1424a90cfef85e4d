#!/usr/bin/env bash
# Stops the cluster that rgw-start.sh started (found through RINGZERO_RGW_DIR) and deletes its state.
# Only processes named in that folder's pid files are signalled, and only the folder carrying
# rgw-start.sh's mark is deleted.
set -uo pipefail

STATE=${RINGZERO_RGW_DIR:-}
[ -n "$STATE" ] || exit 0
[ -f "$STATE/.ringzero-rgw" ] || { echo "rgw-stop: $STATE is not an rgw-start.sh folder; leaving it" >&2; exit 0; }

pids=()
for pidfile in "$STATE"/run/*.pid; do
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  # The pid may have been reused since; signal it only if it still runs with this cluster's config.
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$STATE/ceph.conf"; then
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  fi
done
for pid in "${pids[@]}"; do
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
done
rm -rf "$STATE"
