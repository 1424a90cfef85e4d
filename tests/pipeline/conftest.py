"""Fixtures of the pipeline tests: fake stage runners that also reach the subprocesses a test starts."""

import os

import pytest
from pipeline_kit import PLUGINS

from ringzero.stages.base import TEST_RUNNERS_ENV


@pytest.fixture
def fake_runners(monkeypatch):
    """Every stage kind runs the fakes in plugins/, in this process and in any subprocess it starts."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    from pipeline_fake_runners import RUNNERS

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(TEST_RUNNERS_ENV, ",".join(f"{k}=pipeline_fake_runners:{f}" for k, f in RUNNERS.items()))
