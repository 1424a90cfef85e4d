"""The image locks as the tests read them (``images/<image>/requirements.lock``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("trainer", "rollout", "cpu")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path(image: str) -> Path:
    return ROOT / "images" / image / "requirements.lock"


def pins(image: str) -> dict[str, str]:
    """``{package: version}``; every non-comment line must be ``name==version``."""
    out = {}
    for n, line in enumerate(lock_path(image).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        found = PIN.match(line.strip())
        assert found, f"{lock_path(image)}:{n}: not pinned as name==version: {line!r}"
        out[canonical(found.group(1))] = found.group(2)
    return out


def base_provided(image: str) -> set[str]:
    """The packages the lock's header says the base image provides."""
    for line in lock_path(image).read_text().splitlines():
        if line.startswith("# provided by the base image:"):
            return {canonical(n.strip()) for n in line.split(":", 1)[1].split(",")}
    raise AssertionError(f"{lock_path(image)}: no '# provided by the base image:' line")
