"""Write each image's pinned Python requirements: ``images/<image>/requirements.lock``.

    python images/common/lock.py            # rewrite the three locks
    python images/common/lock.py --check    # exit 1 if a lock differs from what it would write

An image installs its lock with ``pip install --no-deps``, so the lock is the whole set of packages put on
top of the base image, each at one version. What the base image provides (its CUDA torch and what torch
needs; for the rollout image also numpy, which SGLang's torch is built with) is named in ``BASE`` and left
out: pinning it would replace the base's build. The rollout image installs ringzero and its lock into a
folder of its own (``/opt/ringzero``, on ``PYTHONPATH`` of the fetch-model container only), so SGLang's
environment is never changed.

The resolution is pip's (``pip install --dry-run --ignore-installed --report``) under the interpreter that
runs this script, against the package index it is configured with.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# torch and what its wheel requires: every image's base carries them (the cpu image installs torch first).
TORCH = ("torch", "triton", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec",
         "typing-extensions", "setuptools")
BASE = {
    "trainer": TORCH + ("numpy",),  # NVIDIA's PyTorch image: its numpy is the one its extensions are built with
    "rollout": TORCH + ("numpy",),  # SGLang's image
    "cpu": TORCH,
}


def dockerfile_arg(image: str, name: str) -> str:
    found = re.search(rf"^ARG {name}=(\S+)", (ROOT / "images" / image / "Dockerfile").read_text(), re.M)
    if not found:
        raise SystemExit(f"images/{image}/Dockerfile: no ARG {name}=")
    return found.group(1)


def requirements(image: str) -> list[str]:
    """What the image's code paths need, as ranges: ringzero's dependencies; megatron-core (at the trainer
    Dockerfile's version) and einops (megatron-core imports it without declaring it) where stage jobs run
    (trainer; cpu, whose jobs may select the megatron engine on CPU nodes); the kfp extra for the cpu image
    (it compiles and uploads the pipeline and runs the launcher in pipeline steps)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d for d in project["dependencies"] if not d.startswith("torch")]
    if image in ("trainer", "cpu"):
        deps += [f"megatron-core=={dockerfile_arg('trainer', 'MEGATRON_CORE_VERSION')}", "einops>=0.8"]
    if image == "cpu":
        deps += project["optional-dependencies"]["kfp"]
    return deps


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(reqs: list[str], base: set[str]) -> dict[str, str]:
    """``{package: version}`` of everything ``reqs`` need that the base image does not provide: pip's
    resolution, walked from the requirements without entering a base package (so torch's own CUDA
    libraries, which pip resolves for megatron-core's ``torch`` requirement, stay out)."""
    from packaging.requirements import Requirement

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), *reqs], check=True)
        found = {canonical(i["metadata"]["name"]): i["metadata"] for i in json.loads(report.read_text())["install"]}
    out: dict[str, str] = {}
    todo = [Requirement(r) for r in reqs]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in base or name in out:
            continue
        meta = found[name]
        out[name] = meta["version"]
        for dep in meta.get("requires_dist") or []:
            dep = Requirement(dep)
            env_ok = dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (req.extras or {""}))
            if env_ok:
                todo.append(dep)
    return out


def render(image: str) -> str:
    base = {canonical(n) for n in BASE[image]}
    pinned = resolve(requirements(image), base)
    head = [
        f"# images/{image}: the Python packages installed on the base image, all of them (pip install --no-deps).",
        "# Written by images/common/lock.py from these requirements:",
        *[f"#   {r}" for r in requirements(image)],
        f"# provided by the base image: {', '.join(BASE[image])}",
        f"# resolved under CPython {sys.version_info.major}.{sys.version_info.minor}",
    ]
    return "\n".join([*head, *[f"{n}=={v}" for n, v in sorted(pinned.items())]]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for image in BASE:
        path = ROOT / "images" / image / "requirements.lock"
        text = render(image)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("stale: " + ", ".join(stale) + " (run python images/common/lock.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
