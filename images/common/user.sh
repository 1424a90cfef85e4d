#!/bin/sh
# The unprivileged user every image ends as: uid and gid 10001, the chart's runAsUser, no home (the root
# filesystem is read-only in the chart's pods; HOME is /tmp). Bind-mounted like wheel.sh.
set -eu
groupadd --gid 10001 ringzero
useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin ringzero
