"""The comm accounting of every strategy matches the formulas, per rank and per layer call.

Steps: ring P-1 forward (P backward: the last hop returns dK/dV to their owners); a2a 2 each way and
allgather 1 each way, whatever P. Bytes: each collective's logical payload per rank, derived here from
the tensor shapes (``comm.py`` states the convention), and the bytes on the critical path. The Lightning
all-gather volume does not depend on the sequence length; the ring's does.
"""

from __future__ import annotations

import pytest
from cp_jobs import LIGHTNING_DIMS, LING, MLA_DIMS, B, H, core_job, ling_mla_bytes_job
from cp_params import CP_SIZES, cp_param

from ringzero.parallel.sharding import SeqLayout

pytestmark = pytest.mark.distributed


def _records(per_rank: list[dict], strategy: str) -> list[tuple[dict, dict]]:
    """(fwd, bwd) of the single call each rank made."""
    out = []
    for rank_result in per_rank:
        (call,) = rank_result[strategy]["comm"]
        out.append(call)
    return out


@pytest.mark.parametrize("cp", CP_SIZES)
def test_mla_steps_and_bytes(pools, cp):
    seq_len, b = 32, 8  # fp64
    per_rank = pools(cp).run(core_job, "mla", ["a2a", "ring"], seq_len, "float64", "contiguous")
    S = SeqLayout(seq_len, cp).local_len
    d = MLA_DIMS
    P = cp
    pos = B * S * 8  # int64 positions [B, S] travel with the keys
    q, o, lat = B * S * H * (d["n"] + d["p"]) * b, B * S * H * d["v"] * b, B * S * (d["r"] + d["p"]) * b
    a2a_fwd = (P - 1) * (lat + pos) + (q + o) * (P - 1) // P
    a2a_bwd = (o + q + P * lat) * (P - 1) // P
    k, v = B * S * H * (d["n"] + d["p"]) * b, B * S * H * d["v"] * b
    ring_fwd = (P - 1) * (k + v + pos)
    ring_bwd = (P - 1) * (k + v + pos + k + v) + (k + v)
    for fwd, bwd in _records(per_rank, "a2a"):
        assert (fwd["steps"], bwd["steps"]) == (2, 2)
        assert (fwd["bytes_sent"], fwd["bytes_recv"], bwd["bytes_sent"]) == (a2a_fwd, a2a_fwd, a2a_bwd)
        assert (fwd["path_bytes"], bwd["path_bytes"]) == (a2a_fwd, a2a_bwd)
    for fwd, bwd in _records(per_rank, "ring"):
        assert (fwd["steps"], bwd["steps"]) == (P - 1, P)
        assert (fwd["bytes_sent"], fwd["bytes_recv"], bwd["bytes_sent"]) == (ring_fwd, ring_fwd, ring_bwd)
        assert (fwd["path_bytes"], bwd["path_bytes"]) == (ring_fwd, ring_bwd)  # every hop is on the path


@pytest.mark.parametrize("cp", CP_SIZES)
def test_lightning_steps_and_bytes(pools, cp):
    P = cp
    d = LIGHTNING_DIMS
    state = B * H * d["k"] * d["v"] * 8  # fp64 body -> fp64 state
    volumes = {}
    for seq_len in (16, 48):
        per_rank = pools(cp).run(
            core_job, "lightning", ["allgather", "ring"], seq_len, "float64", "contiguous"
        )
        for fwd, bwd in _records(per_rank, "allgather"):
            assert (fwd["steps"], bwd["steps"]) == (1, 1)
            assert fwd["bytes_sent"] == fwd["bytes_recv"] == bwd["bytes_sent"] == (P - 1) * state
            assert fwd["path_bytes"] == bwd["path_bytes"] == (P - 1) * state
        volumes[seq_len] = [f["bytes_sent"] + b["bytes_sent"] for f, b in _records(per_rank, "allgather")]
        for rank, (fwd, bwd) in enumerate(_records(per_rank, "ring")):
            assert (fwd["steps"], bwd["steps"]) == (P - 1, P - 1)
            # the state goes forward from every rank but the last, its gradient back from all but the first
            assert fwd["bytes_sent"] == (state if rank < P - 1 else 0)
            assert fwd["bytes_recv"] == (state if rank > 0 else 0)
            assert bwd["bytes_sent"] == (state if rank > 0 else 0)
            # one state per rank, but the P-1 hops of the chain run one after another
            assert fwd["path_bytes"] == bwd["path_bytes"] == (P - 1) * state
    assert volumes[16] == volumes[48]


@pytest.mark.parametrize("cp", [cp_param(4)])
def test_zigzag_allgather_moves_two_states_per_rank(pools, cp):
    per_rank = pools(cp).run(core_job, "lightning", ["allgather"], 16, "float64", "zigzag")
    state = B * H * LIGHTNING_DIMS["k"] * LIGHTNING_DIMS["v"] * 8
    for fwd, bwd in _records(per_rank, "allgather"):
        assert (fwd["steps"], fwd["bytes_sent"]) == (1, (cp - 1) * 2 * state)
        assert (bwd["steps"], bwd["bytes_sent"]) == (1, (cp - 1) * 2 * state)


@pytest.mark.parametrize("cp", [cp_param(4)])
def test_ling_dims_a2a_moves_a_third_of_ring_kv(pools, cp):
    """Forward bytes of MLA a2a over ring on materialised K/V: ``(r+dr)/(H (dqk+dv)) + 1/P`` (0.306 at
    P=4), recorded from real calls with Ling-like dims."""
    recorded = {s: pools(cp).run(ling_mla_bytes_job, s, 64)[0][0]["bytes_sent"] for s in ("a2a", "ring")}
    d = LING
    predicted = (d["r"] + d["p"]) / (d["H"] * (d["n"] + d["p"] + d["v"])) + 1 / cp
    assert recorded["a2a"] / recorded["ring"] == pytest.approx(predicted, rel=0.01)
    assert recorded["a2a"] / recorded["ring"] == pytest.approx(0.31, abs=0.01)
