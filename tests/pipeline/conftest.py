"""Fixtures of the pipeline tests: fake stage runners that also reach the subprocesses a test starts."""

import os

import pytest
from micro_policy import trained_store
from pipeline_kit import PLUGINS

from ringzero.stages.base import TEST_RUNNERS_ENV


@pytest.fixture
def fake_runners(monkeypatch):
    """Every stage kind runs the fakes in plugins/, in this process and in any subprocess it starts."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    from pipeline_fake_runners import RUNNERS

    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv(
        TEST_RUNNERS_ENV, ",".join(f"{k}=pipeline_fake_runners:{f}" for k, f in RUNNERS.items())
    )


@pytest.fixture(scope="session")
def micro_policy_store(tmp_path_factory):
    """The micro policy, trained once per worker (its tests share an xdist group, hence one worker)."""
    return trained_store(tmp_path_factory.mktemp("micro-policy"))
