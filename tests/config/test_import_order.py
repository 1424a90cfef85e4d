"""Any config module can be the first import of a process (no import cycles through ringzero.config)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    ["ringzero.stages.config", "ringzero.model.config", "ringzero.tasks.config", "ringzero.store.config",
     "ringzero.parallel.config", "ringzero.config.run", "ringzero.config.loader", "ringzero.config"],
)
def test_first_import(module):
    out = subprocess.run([sys.executable, "-c", f"import {module}; import sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "config modules must not import torch"
