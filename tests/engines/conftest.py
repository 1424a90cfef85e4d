"""Fixtures the megatron engine tests share: megatron's parallel state in this process, pools of gloo ranks,
the torch engine's one-process run every layout is compared with."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ringzero.engines.megatron  # noqa: F401  - imports megatron.core, its jit fuser off on CPU, before a test does
from ringzero.parallel.launch import RankPool


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo group and megatron's parallel state at TP = 1 in this process, torn down after."""
    from megatron.core import parallel_state

    torch.set_num_threads(1)
    made = not dist.is_initialized()
    if made:
        dist.init_process_group(
            "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
        )
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


@pytest.fixture(scope="module")
def pools():
    with RankPool(1, timeout_s=300) as one, RankPool(2, timeout_s=300) as two:
        yield {1: one, 2: two}


@pytest.fixture(scope="module")
def torch_run(pools, tmp_path_factory):
    """The micro run under the torch engine on one process (``megatron_stage_jobs.engine_record``)."""
    from megatron_stage_jobs import run_engine

    return pools[1].run(run_engine, "torch", 1, f"file://{tmp_path_factory.mktemp('torch')}/store")[0]
