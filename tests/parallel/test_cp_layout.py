"""Sharding layouts, parallel dims and plan refusals: everything decided before any rank talks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ringzero.errors import RingzeroError
from ringzero.metrics import MemoryMetricWriter
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.lightning import LightningCore
from ringzero.model.mla import MLACore
from ringzero.parallel.comm import CommLedger
from ringzero.parallel.dims import ParallelDims, ParallelGroups
from ringzero.parallel.parallelize import check_plan, parallelize
from ringzero.parallel.sharding import SeqLayout


def test_contiguous_and_zigzag_positions():
    assert [SeqLayout(8, 2).positions(r).tolist() for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    zig = [SeqLayout(16, 4, "zigzag").positions(r).tolist() for r in range(4)]
    # rank p holds chunks p and 2P-1-p of 2P chunks of length 2
    assert zig == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]


def test_uneven_length_is_padded_at_the_end_and_marked():
    lay = SeqLayout(10, 4, "zigzag")  # 8 chunks of 2 -> 16 slots, 6 of them padding
    assert (lay.chunk_len, lay.padded_len, lay.local_len, lay.padding) == (2, 16, 4, 6)
    real = torch.cat([lay.positions(r)[lay.valid_mask(r)] for r in range(4)]).sort().values
    assert real.tolist() == list(range(10))
    x = torch.arange(10.0)[None]
    assert lay.shard(x, 0, pad_value=-7).tolist() == [[0.0, 1.0, -7.0, -7.0]]


@settings(max_examples=60, deadline=None)
@given(seq_len=st.integers(1, 70), cp=st.integers(1, 5), mode=st.sampled_from(["contiguous", "zigzag"]))
def test_shard_unshard_round_trip(seq_len, cp, mode):
    lay = SeqLayout(seq_len, cp, mode)
    x = torch.randn(2, seq_len, 3)
    parts = [lay.shard(x, r) for r in range(cp)]
    assert all(p.shape == (2, lay.local_len, 3) for p in parts)
    assert torch.equal(lay.unshard(parts), x)
    covered = torch.cat([lay.positions(r) for r in range(cp)]).sort().values
    assert covered.tolist() == list(range(lay.padded_len))


def test_shard_names_the_sizes_on_mismatch():
    with pytest.raises(RingzeroError, match="tensor has 9 positions on dim 1, layout expects 10"):
        SeqLayout(10, 2).shard(torch.zeros(1, 9), 0)
    with pytest.raises(RingzeroError, match="sharding must be one of"):
        SeqLayout(10, 2, "striped")


def test_parallel_dims_checked_against_world_size():
    assert ParallelDims(dp=2, cp=4, world_size=8).coords(5) == (1, 1)
    assert ParallelDims(dp=2, cp=4, world_size=8).cp_ranks(1) == [4, 5, 6, 7]
    with pytest.raises(RingzeroError, match=r"dp\*cp\*tp\*pp = 2\*4\*1\*1 = 8 does not match world size 6"):
        ParallelDims(dp=2, cp=4, world_size=6)
    # pipeline stages outermost: one stage's dp x cp x tp ranks are neighbours
    dims = ParallelDims(dp=1, cp=2, world_size=8, tp=2, pp=2)
    assert [dims.pp_index(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert dims.pp_ranks(0, 1, 1) == [3, 7] and dims.replica_ranks(1, pp_index=1) == [5, 7]
    assert dims.values_ranks(1) == [1, 3, 5, 7] and dims.coords(6) == (0, 1)
    # TP innermost, then CP (megatron-core's order): the ranks of one replica's shards are neighbours
    dims = ParallelDims(dp=2, cp=2, world_size=8, tp=2)
    assert [dims.coords(r) for r in range(8)] == [
        (0, 0),
        (0, 0),
        (0, 1),
        (0, 1),
        (1, 0),
        (1, 0),
        (1, 1),
        (1, 1),
    ]
    assert [dims.tp_index(r) for r in range(8)] == [0, 1] * 4
    assert dims.tp_ranks(1, 0) == [4, 5] and dims.cp_ranks(1, tp_index=1) == [5, 7]
    assert dims.dp_ranks(0, tp_index=1) == [1, 5] and dims.replica_ranks(1) == [1, 3, 5, 7]
    assert ParallelDims(dp=2, cp=1, world_size=2).replica_ranks() == [0, 1]
    with pytest.raises(RingzeroError, match=r"dp\*cp\*tp\*pp = 1\*2\*2\*1 = 4 does not match world size 2"):
        ParallelDims(dp=1, cp=2, world_size=2, tp=2)
    # EP is carved out of DP (megatron-core's way): a divisor of dp, the world size unchanged
    ep = ParallelDims(dp=4, cp=1, world_size=8, tp=2, ep=2)
    assert [ep.ep_index(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert ep.expert_dp_ranks(3) == [3, 7] and ep.expert_dp_ranks(4) == [0, 4]
    assert ParallelDims(dp=2, cp=1, world_size=2, ep=2).expert_dp_ranks(1) == [1]
    with pytest.raises(RingzeroError, match=r"2 does not divide dp x cp \(3 x 1 = 3\)"):
        ParallelDims(dp=3, cp=1, world_size=3, ep=2)
    # under CP megatron folds the CP ranks in: a sequence's two CP ranks hold two expert shards
    folded = ParallelDims(dp=2, cp=2, world_size=4, ep=2)
    assert [folded.ep_index(r) for r in range(4)] == [0, 1, 0, 1]
    assert folded.expert_dp_ranks(0) == [0, 2] and folded.expert_dp_ranks(3) == [1, 3]
    assert ParallelDims(dp=1, cp=2, world_size=2, ep=2).expert_dp_ranks(1) == [1]
    with pytest.raises(RingzeroError, match="cp must be an integer >= 1"):
        ParallelDims(dp=1, cp=0, world_size=1)


def _model(num_attention_heads=4, layout="LMLM"):
    cfg = ModelConfig(
        vocab_size=16,
        hidden_size=32,
        num_hidden_layers=len(layout),
        num_attention_heads=num_attention_heads,
        layout=layout,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=4,
        v_head_dim=4,
        head_dim=4,
        partial_rotary_factor=1.0,
        intermediate_size=16,
    )
    return HybridLM(cfg, PrecisionPolicy.preset("fp32"))


def test_plan_refusals_name_layer_and_reason():
    model = _model(num_attention_heads=6)
    problems = check_plan(model, cp=4)
    assert len(problems) == 2 and all("num_attention_heads % cp == 0" in p for p in problems)
    assert problems[0].startswith("layers.1.attention (mla, a2a)")
    assert check_plan(model, cp=3) == []
    assert check_plan(model, cp=4, plan={"mla": "ring", "lightning": "allgather"}) == []
    zig = check_plan(model, cp=2, plan={"mla": "ring", "lightning": "ring"}, sharding="zigzag")
    assert len(zig) == 2 and all("needs contiguous shards" in p for p in zig)
    crossed = check_plan(model, cp=2, plan={"mla": "allgather", "lightning": "a2a"})
    assert any(
        "does not support mla layers" in p and "softmax attention has no such state" in p for p in crossed
    )
    assert any("does not support lightning layers" in p for p in crossed)


def test_parallelize_refuses_before_touching_the_model():
    model = _model(num_attention_heads=6)
    groups = ParallelGroups(ParallelDims(dp=1, cp=4, world_size=4), rank=0, cp=None, dp=None, dp_cp=None)
    with pytest.raises(RingzeroError, match="cannot apply context parallelism"):
        parallelize(model, groups)
    assert all(type(b.attention.core) in (MLACore, LightningCore) for b in model.layers)


def test_parallelize_at_cp1_leaves_single_device_cores():
    model = _model()
    groups = ParallelGroups(ParallelDims(dp=1, cp=1, world_size=1), rank=0, cp=None, dp=None, dp_cp=None)
    ledger = parallelize(model, groups)
    assert ledger.metrics() == {}
    assert all(type(b.attention.core) in (MLACore, LightningCore) for b in model.layers)


def test_ledger_metrics_are_namespaced_sums():
    ledger = CommLedger()
    for _ in range(2):
        rec = ledger.new_call("mla", "a2a")
        rec.fwd.add(2, 100, 90, 100)
        rec.bwd.add(2, 50, 40, 30)
    ledger.new_call("lightning", "allgather").fwd.add(1, 8, 8)
    m = ledger.metrics()
    assert m["cp/mla/calls"] == 2 and m["cp/mla/steps"] == 8 and m["cp/mla/steps_per_call"] == 4
    assert (m["cp/mla/bytes_sent"], m["cp/mla/bytes_recv"], m["cp/mla/path_bytes"]) == (300, 260, 260)
    assert m["cp/lightning/steps_fwd"] == 1 and m["cp/lightning/steps_bwd"] == 0
    MemoryMetricWriter().log(0, m)  # the project's metric writer accepts every key


def test_pipeline_layout_is_megatrons_rank_order():
    """The stage groups ringzero builds are megatron-core's (order tp-cp-ep-dp-pp), checked against its own
    rank generator: megatron's schedule sends activations over its pipeline group, ringzero sums over its."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    dims = ParallelDims(dp=2, cp=2, world_size=16, tp=2, pp=2)
    gen = parallel_state.RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=2, order="tp-cp-ep-dp-pp")
    ours_pp = sorted(dims.pp_ranks(d, c, t) for d in range(2) for c in range(2) for t in range(2))
    ours_dp_cp = sorted(dims.replica_ranks(t, p) for t in range(2) for p in range(2))
    ours_tp = sorted(dims.tp_ranks(d, c, p) for d in range(2) for c in range(2) for p in range(2))
    assert ours_pp == sorted(gen.get_ranks("pp"))
    assert ours_dp_cp == sorted(gen.get_ranks("dp-cp"))
    assert ours_tp == sorted(gen.get_ranks("tp"))


def test_a_job_of_the_wrong_size_names_every_degree_including_the_pipeline():
    from types import SimpleNamespace

    from ringzero.parallel.runtime import from_env

    parallel = SimpleNamespace(dp=2, cp=1)
    with pytest.raises(
        RingzeroError,
        match=r"parallel.dp x parallel.cp x engines.training.tp x engines.training.pp = "
        r"2 x 1 x 2 x 2 = 8 ranks, but the job has WORLD_SIZE=4",
    ):
        from_env(parallel, "cpu", env={"WORLD_SIZE": "4", "RANK": "0"}, tp=2, pp=2)
    with pytest.raises(
        RingzeroError, match=r"parallel.dp x parallel.cp x engines.training.pp = 2 x 1 x 2 = 4 ranks"
    ):
        from_env(parallel, "cpu", env={"WORLD_SIZE": "2", "RANK": "0"}, pp=2)
