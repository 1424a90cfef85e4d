"""Model tests run single-threaded on tiny dims; helpers live in model_kit / model_reference."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
