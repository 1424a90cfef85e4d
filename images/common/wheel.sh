#!/bin/sh
# The build steps every image shares, bind-mounted at build time (never copied into an image):
#   RUN --mount=type=bind,source=images/common,target=/common sh /common/wheel.sh
# In the source stage: ringzero as a wheel in /wheels, plus /wheels/requirements.txt, its runtime
# requirements without torch (an image's base may carry its own CUDA torch, which must stay).
set -eu
pip wheel --no-deps --no-cache-dir --wheel-dir /wheels .
python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/wheels/requirements.txt', 'w').write(''.join(d + '\n' for d in deps if not d.startswith('torch')))"
