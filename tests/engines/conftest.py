"""Fixtures the megatron engine tests share: megatron's parallel state in this process, a pool of two gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ringzero.parallel.launch import RankPool


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group and megatron's parallel state at TP = 1 in this process, torn down after."""
    from megatron.core import parallel_state

    torch.set_num_threads(1)
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if made:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    with RankPool(2, timeout_s=300) as pool:
        yield pool
