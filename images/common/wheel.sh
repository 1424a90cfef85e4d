#!/bin/sh
# The build steps every image shares, bind-mounted at build time (never copied into an image):
#   RUN --mount=type=bind,source=images/common,target=/common sh /common/wheel.sh
# In the source stage: ringzero as a wheel in /wheels. Its dependencies come from the image's own
# requirements.lock (every package pinned, installed with --no-deps; written by images/common/lock.py).
set -eu
pip wheel --no-deps --no-cache-dir --wheel-dir /wheels .
