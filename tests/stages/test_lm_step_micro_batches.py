"""How ``lm_step`` cuts a rank's rows into micro-batches: at most ``micro_batch`` rows each; under expert
parallelism every data-parallel rank makes as many as the largest share needs (their MoE layers meet in
every forward), and a batch too small for that is refused on every rank alike."""

from __future__ import annotations

import pytest
import torch

from ringzero.errors import RingzeroError
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.runtime import Runtime
from ringzero.stages.lm_step import micro_batch_rows


def runtime(dp: int, rank: int) -> Runtime:
    return Runtime(device=torch.device("cpu"), dims=ParallelDims(dp=dp, cp=1, world_size=dp), rank=rank)


def shares(total: int, dp: int, micro_batch: int, equal: bool) -> list[list[list[int]]]:
    out = []
    for rank in range(dp):
        rt = runtime(dp, rank)
        rows = list(range(total))[rt.dp_slice(total)]
        out.append(micro_batch_rows(rows, total, rt, micro_batch, equal))
    return out


def test_plain_cuts_follow_micro_batch_and_may_differ_in_count():
    got = shares(5, 2, 2, equal=False)
    assert got == [[[0, 1]], [[2, 3], [4]]]


def test_expert_parallel_cuts_have_one_count_on_every_rank():
    for total, dp, mb in [(5, 2, 2), (7, 4, 2), (9, 2, 4), (64, 4, 16), (6, 3, 1)]:
        got = shares(total, dp, mb, equal=True)
        assert len({len(parts) for parts in got}) == 1, (total, dp, mb, got)
        assert all(0 < len(p) <= mb for parts in got for p in parts)
        assert sorted(r for parts in got for p in parts for r in p) == list(range(total))


def test_a_batch_too_small_for_equal_counts_is_refused_on_every_rank():
    for rank in range(4):  # shares 1, 2, 2, 2 would need 2 micro-batches of 1 row
        rt = runtime(4, rank)
        rows = list(range(7))[rt.dp_slice(7)]
        with pytest.raises(RingzeroError, match="smallest share 1 rows for 2 micro-batches"):
            micro_batch_rows(rows, 7, rt, 1, True)
