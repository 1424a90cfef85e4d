"""Fixtures of the Kubeflow pipeline tests: micro configs and fake stage runners that reach subprocesses."""

import os

import pytest
from kfp_kit import PLUGINS

from ringzero.stages.base import TEST_RUNNERS_ENV


def pytest_configure(config):
    # Registered here too, so the marker stays valid when the suite runs without pytest-xdist.
    config.addinivalue_line("markers", "xdist_group(name): run in the named pytest-xdist worker group")


@pytest.fixture
def fake_runners(monkeypatch):
    """Stage runners replaced by the fakes in plugins/, in this process and in every subprocess it starts."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    from fake_stage_runners import RUNNERS

    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv(TEST_RUNNERS_ENV, ",".join(f"{k}=fake_stage_runners:{f}" for k, f in RUNNERS.items()))
