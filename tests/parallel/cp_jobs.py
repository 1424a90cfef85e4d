"""Jobs the CP tests run on every rank of a pool (module level, so spawned ranks can import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.parallel import mla_cp, ring_attention
from ringzero.parallel.comm import CommLedger
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.sharding import SeqLayout
from ringzero.parallel.strategies import STRATEGIES

B, H = 2, 4
MLA_DIMS = {"n": 8, "p": 4, "v": 6, "r": 10}
LIGHTNING_DIMS = {"k": 5, "v": 6, "block": 4}
SCALE = 0.3


def core_inputs(kind: str, seq_len: int, seed: int, left_pad: int = 2) -> dict:
    """Global fp64 inputs of one core call; row 1 is left-padded by ``left_pad`` tokens."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    pos = torch.arange(seq_len).repeat(B, 1)
    pos[1] -= left_pad
    if kind == "mla":
        d = MLA_DIMS
        tokens = {
            "q_nope": rnd(B, seq_len, H, d["n"]),
            "q_rope": rnd(B, seq_len, H, d["p"]),
            "c_kv": rnd(B, seq_len, d["r"]),
            "k_rope": rnd(B, seq_len, d["p"]),
        }
        weights = {
            "w_uk": rnd(H, d["n"], d["r"]) / d["r"] ** 0.5,
            "w_uv": rnd(H, d["v"], d["r"]) / d["r"] ** 0.5,
        }
        cotangent = rnd(B, seq_len, H, d["v"])
        return {"tokens": tokens, "weights": weights, "cotangent": cotangent, "positions": pos}
    d = LIGHTNING_DIMS
    keep = (pos >= 0).double()[..., None, None]  # padding carries no key/value, as the layer arranges
    tokens = {
        "q": rnd(B, seq_len, H, d["k"]) * 0.5,
        "k": rnd(B, seq_len, H, d["k"]) * 0.5 * keep,
        "v": rnd(B, seq_len, H, d["v"]) * keep,
    }
    log_decay = -torch.linspace(0.05, 0.6, H, dtype=torch.float64)
    cotangent = rnd(B, seq_len, H, d["v"])
    return {"tokens": tokens, "weights": {}, "cotangent": cotangent, "positions": pos, "log_decay": log_decay}


def _call(kind, core, tokens, weights, pos, inputs, dtype):
    if kind == "mla":
        return core(
            tokens["q_nope"],
            tokens["q_rope"],
            tokens["c_kv"],
            tokens["k_rope"],
            weights["w_uk"],
            weights["w_uv"],
            pos,
            SCALE,
            True,
        )
    state = torch.promote_types(dtype, torch.float32)
    return core(tokens["q"], tokens["k"], tokens["v"], inputs["log_decay"].to(state), LIGHTNING_DIMS["block"])


def core_job(
    ctx,
    kind: str,
    strategies: list[str],
    seq_len: int,
    dtype: str,
    mode: str,
    seed: int = 0,
    block_rows: int | None = None,
):
    """Each strategy's CP core on the shared inputs; rank 0 returns gathered outputs and all gradients
    (weight gradients summed over the group), every rank its comm records. ``block_rows`` shrinks the
    ring's pieces and the a2a query blocks (512 in production) so short test sequences use many."""
    if block_rows is not None:
        saved = ring_attention.PIECE_ROWS, mla_cp.QUERY_BLOCK
        ring_attention.PIECE_ROWS = mla_cp.QUERY_BLOCK = block_rows
        try:
            return core_job(ctx, kind, strategies, seq_len, dtype, mode, seed)
        finally:
            ring_attention.PIECE_ROWS, mla_cp.QUERY_BLOCK = saved
    P = ctx.world_size
    groups = ctx.groups(ParallelDims(dp=1, cp=P, world_size=P))
    tdtype = getattr(torch, dtype)
    inputs = core_inputs(kind, seq_len, seed)
    layout = SeqLayout(seq_len, P, mode)
    me = groups.cp_rank
    results = {}
    for strategy in strategies:
        ledger = CommLedger()
        core = STRATEGIES[(kind, strategy)].build(groups.cp, ledger, mode)
        tokens = {k: layout.shard(v, me).to(tdtype).requires_grad_(True) for k, v in inputs["tokens"].items()}
        weights = {k: v.to(tdtype).clone().requires_grad_(True) for k, v in inputs["weights"].items()}
        pos = layout.shard(inputs["positions"], me, pad_value=-1)
        out = _call(kind, core, tokens, weights, pos, inputs, tdtype)
        (out * layout.shard(inputs["cotangent"], me).to(tdtype)).sum().backward()
        res = {"out": layout.gather(out.detach(), groups.cp)}
        for k, t in tokens.items():
            res["d_" + k] = layout.gather(t.grad, groups.cp)
        for k, t in weights.items():
            g = t.grad.clone()
            dist.all_reduce(g, group=groups.cp)
            res["d_" + k] = g
        res["comm"] = [(c.fwd.__dict__.copy(), c.bwd.__dict__.copy()) for c in ledger.calls]
        results[strategy] = res
    if me != 0:
        return {s: {"comm": r["comm"]} for s, r in results.items()}
    return results


LING = {"H": 32, "n": 128, "p": 64, "v": 128, "r": 512}  # Ling-like MLA dims (bytes tests and bench)


def ling_mla_bytes_job(ctx, strategy: str, seq_len: int, dtype: str = "bfloat16"):
    """One MLA core call with Ling-like dims (batch 1, positions ``[S]``); every rank's comm record."""
    P = ctx.world_size
    groups = ctx.groups(ParallelDims(dp=1, cp=P, world_size=P))
    tdtype = getattr(torch, dtype)
    d, S = LING, seq_len // P
    gen = torch.Generator().manual_seed(ctx.rank)

    def rnd(*shape):
        return (torch.randn(shape, generator=gen) * 0.1).to(tdtype).requires_grad_(True)

    ledger = CommLedger()
    core = STRATEGIES[("mla", strategy)].build(groups.cp, ledger, "contiguous")
    out = core(
        rnd(1, S, d["H"], d["n"]),
        rnd(1, S, d["H"], d["p"]),
        rnd(1, S, d["r"]),
        rnd(1, S, d["p"]),
        rnd(d["H"], d["n"], d["r"]),
        rnd(d["H"], d["v"], d["r"]),
        SeqLayout(seq_len, P).positions(ctx.rank),
        0.07,
        True,
    )
    out.float().sum().backward()
    (call,) = ledger.calls
    return call.fwd.__dict__.copy(), call.bwd.__dict__.copy()


def loss_job(ctx, dp: int, cp: int, mode: str = "zigzag"):
    """token_mean and sequence_mean on (dp, cp) shards of one batch: the globally summed value and each
    rank's gradient, with the batch, to compare against the unsharded formulas."""
    from ringzero.parallel.grads import global_sum, sequence_mean, token_mean

    groups = ctx.groups(ParallelDims(dp=dp, cp=cp, world_size=dp * cp))
    gen = torch.Generator().manual_seed(7)
    Bg, S = 2 * dp, 13
    values = torch.randn(Bg, S, generator=gen, dtype=torch.float64)
    mask = torch.rand(Bg, S, generator=gen) < 0.7
    layout = SeqLayout(S, cp, mode)
    rows = slice(groups.dp_rank * 2, groups.dp_rank * 2 + 2)
    out = {}
    for name, fn in (("token", token_mean), ("sequence", sequence_mean)):
        v = layout.shard(values[rows], groups.cp_rank).requires_grad_(True)
        m = layout.shard(mask[rows], groups.cp_rank, pad_value=False)
        term = fn(v, m, groups)
        term.backward()
        full_grad = torch.zeros(Bg, layout.padded_len, dtype=torch.float64)
        full_grad[rows, layout.positions(groups.cp_rank)] = v.grad
        out[name] = (global_sum(term, groups.dp_cp).item(), global_sum(full_grad, groups.dp_cp)[:, :S])
    return out, values, mask
