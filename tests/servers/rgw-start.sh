#!/usr/bin/env bash
# Starts a throwaway Ceph cluster on 127.0.0.1 for the s3:// integration tests: one monitor, one
# memstore OSD, cephx off, and a RADOS Gateway (beast frontend) with one S3 user.
#
# stdout carries only `export VAR=value` lines for the test runner to eval:
#   RINGZERO_RGW_ENDPOINT, RINGZERO_RGW_ACCESS_KEY, RINGZERO_RGW_SECRET_KEY, RINGZERO_RGW_DIR
# (RINGZERO_RGW_DIR holds the state, the logs and `restart-rgw`, which the kill-mid-upload test uses).
# If the cluster cannot start, stdout carries `export RINGZERO_RGW_ERROR=...` instead and the
# script exits non-zero, so the rgw tests fail with the reason rather than skip quietly.
# Everything else goes to stderr. Stop it with tests/servers/rgw-stop.sh.
set -euo pipefail

log() { echo "rgw-start: $*" >&2; }
fail() {
  log "FAILED: $*"
  if [ -n "${STATE:-}" ]; then
    tail -n 20 "$STATE"/log/*.log >&2 2>/dev/null || true
    RINGZERO_RGW_DIR=$STATE "$(dirname "$0")/rgw-stop.sh"  # stop what did start, delete the state
  fi
  printf 'export RINGZERO_RGW_ERROR=%q\n' "Ceph RADOS Gateway did not start: $*"
  exit 1
}
# shellcheck source=start_kit.sh
. "$(dirname "$0")/start_kit.sh"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to $1 seconds for the command in the remaining arguments to succeed.
wait_for() {
  local limit=$1; shift
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

# curl probes the gateway, uuidgen (uuid-runtime) names the cluster
need_packages radosgw ceph-mon ceph-osd curl uuid-runtime
T0=$SECONDS

STATE=$(mktemp -d "${TMPDIR:-/tmp}/ringzero-rgw.XXXXXX")
touch "$STATE/.ringzero-rgw"  # rgw-stop.sh deletes only folders carrying this mark
mkdir -p "$STATE"/{run,log,mon/ceph-a,osd/ceph-0}
CONF=$STATE/ceph.conf
MON_PORT=$(free_port)
RGW_PORT=$(free_port)
FSID=$(uuidgen)
ACCESS_KEY=ringzero$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
SECRET_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')

# A single-OSD, single-replica cluster: replication to 1, CRUSH choosing among OSDs rather than
# hosts, few placement groups, and the health warnings about all of that silenced.
cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
# Without cephx there is no session key, so the "secure" wire mode daemons ask for cannot work.
ms mon client mode = crc
ms mon service mode = crc
ms mon cluster mode = crc
ms client mode = crc
ms service mode = crc
ms cluster mode = crc
mon warn on insecure global id reclaim allowed = false
ms bind ipv4 = true
ms bind ipv6 = false
public network = 127.0.0.0/8
run dir = $STATE/run
pid file = $STATE/run/\$name.pid
admin socket = $STATE/run/\$name.asok
log file = $STATE/log/\$name.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
# A one-monitor cluster has nobody to batch map updates with: commit them at once. The gateway
# creates its pools one after another at first start, each waiting for a map update.
paxos propose interval = 0.05
paxos min wait = 0.01
mon data avail warn = 1
mon data avail crit = 0
[mon]
mon data = $STATE/mon/\$cluster-\$id
[osd]
osd data = $STATE/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = 4294967296
osd crush update on start = true
[client.rgw.ringzero]
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw data = $STATE/rgw
rgw enable usage log = false
rgw dns name = 127.0.0.1
# The metadata cache notifies every gateway's watch on each bucket change; a gateway killed by a test
# leaves a watch that stalls those notifications (about 30 s) until it times out. One gateway needs no cache.
rgw cache enabled = false
EOF
mkdir -p "$STATE/rgw"

# `restart-rgw` starts the gateway again after a test killed it; the data lives in the OSD.
cat >"$STATE/restart-rgw" <<EOF
#!/usr/bin/env bash
set -euo pipefail
radosgw -c "$CONF" -n client.rgw.ringzero
for _ in \$(seq 150); do
  curl -fsS -o /dev/null "http://127.0.0.1:$RGW_PORT/" && exit 0
  sleep 0.2
done
echo "radosgw did not answer on 127.0.0.1:$RGW_PORT" >&2
exit 1
EOF
chmod +x "$STATE/restart-rgw"

log "state in $STATE (monitor on $MON_PORT, gateway on $RGW_PORT)"
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$STATE/monmap" >&2 \
  || fail "monmaptool failed"
ceph-mon -c "$CONF" --mkfs -i a --monmap "$STATE/monmap" >&2 || fail "ceph-mon --mkfs failed"
ceph-mon -c "$CONF" -i a >&2 || fail "ceph-mon did not start"
wait_for 30 ceph -c "$CONF" --connect-timeout 5 mon stat || fail "the monitor did not answer"
log "monitor up after $((SECONDS - T0)) s"

OSD_UUID=$(uuidgen)
OSD_ID=$(ceph -c "$CONF" osd new "$OSD_UUID") || fail "ceph osd new failed"
ceph-osd -c "$CONF" -i "$OSD_ID" --mkfs --osd-uuid "$OSD_UUID" >&2 2>>"$STATE/log/osd-mkfs.log" \
  || fail "ceph-osd --mkfs failed"
ceph-osd -c "$CONF" -i "$OSD_ID" >&2 || fail "ceph-osd did not start"
osd_up() { ceph -c "$CONF" osd dump 2>/dev/null | grep -q "^osd.$OSD_ID up"; }
wait_for 60 osd_up || fail "osd.$OSD_ID did not come up"
log "osd.$OSD_ID up after $((SECONDS - T0)) s"

radosgw -c "$CONF" -n client.rgw.ringzero >&2 || fail "radosgw did not start"
wait_for 60 curl -fsS -o /dev/null "http://127.0.0.1:$RGW_PORT/" || fail "radosgw did not answer on port $RGW_PORT"
log "gateway up after $((SECONDS - T0)) s"
radosgw-admin -c "$CONF" user create --uid=ringzero --display-name=ringzero \
  --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null 2>>"$STATE/log/radosgw-admin.log" \
  || fail "radosgw-admin user create failed"

log "ready in $((SECONDS - T0)) s"
printf 'export RINGZERO_RGW_ENDPOINT=%q\n' "127.0.0.1:$RGW_PORT"
printf 'export RINGZERO_RGW_ACCESS_KEY=%q\n' "$ACCESS_KEY"
printf 'export RINGZERO_RGW_SECRET_KEY=%q\n' "$SECRET_KEY"
printf 'export RINGZERO_RGW_DIR=%q\n' "$STATE"
