"""Tests that need a server, a tool or an optional package: skipped where it is missing, failed under CI.

A missing requirement on a developer's machine is a skip with a reason; on CI (``CI=true``), whose
install provides every such requirement (``make install``: the dev, test and kfp extras, and the servers
``tests/servers/*-start.sh`` start), the same absence is a failure, so nothing stops being tested
silently. ``tests/conftest.py`` applies the same rule to skips raised elsewhere whose reason starts with
``MISSING`` and to ``pytest.importorskip`` of the packages the CI install provides. Skips for what CI
legitimately lacks (a CUDA device) use plain ``pytest.skip`` / ``skipif`` and stay skips.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

MISSING = "missing requirement:"
# Top-level modules of the packages `make install` puts in CI's environment (pyproject dev/test/kfp extras).
CI_PROVIDED = frozenset(
    {
        "pytest",
        "xdist",
        "pytest_timeout",
        "hypothesis",
        "moto",
        "boto3",
        "requests",
        "openai",
        "jsonschema",
        "kubernetes_validate",
        "transformers",
        "tokenizers",
        "megatron",
        "einops",
        "kfp",
        "kubernetes",
    }
)


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(name: str, reason: str) -> NoReturn:
    """``name`` (a server, a binary, a package) is missing: skip, or fail under CI."""
    message = f"{MISSING} {name}: {reason}"
    if on_ci():
        pytest.fail(f"{message} (CI=true: CI provides it, so its absence is a failure)", pytrace=False)
    pytest.skip(message)


def require_module(name: str, reason: str = "") -> ModuleType:
    """``import name``, or ``require_tool`` when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require_tool(name, reason or f"could not import it ({exc}); install the test extras (make install)")
