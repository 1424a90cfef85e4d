"""CP versus single process on the same global inputs: what ``ringzero check cp`` and the tests measure.

Every rank builds the same weights and the same global batch from one seed, runs forward and backward
on its shard through the CP cores, and rank 0 compares against the unsharded single-process run:
the output, the input gradient and every weight gradient (after the CP gradient sum). ``model`` runs a
whole ``HybridLM`` step instead: loss with global token normalisation, logits, every parameter gradient
and the parameters after one step of the training optimizer. With ``dp > 1`` the batch rows are split over
data-parallel replicas as well. Row 1 of the batch is left-padded (negative positions), so per-row positions
are covered too. Tolerances per dtype come from ``ringzero.model.tolerances``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.lightning import LightningAttention
from ringzero.model.logprobs import token_logprobs
from ringzero.model.mla import MLAttention
from ringzero.model.precision import torch_dtype
from ringzero.model.tolerances import compare
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.grads import global_sum, sync_grads, token_mean
from ringzero.parallel.parallelize import check_plan, parallelize
from ringzero.parallel.sharding import SeqLayout

LAYERS = ("mla", "lightning", "model")


@dataclass(frozen=True)
class CheckSpec:
    layer: str = "mla"
    strategy: str = "a2a"
    cp: int = 2
    seq_len: int = 64
    heads: int = 4
    dtype: str = "float64"
    sharding: str = "contiguous"
    batch: int = 2
    left_pad: int = 3
    seed: int = 0
    block_size: int = 8
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.cp

    def plan(self) -> dict[str, str]:
        """Layer checks use ``strategy`` for their layer type; ``model`` maps ``ring`` to ring for both
        layer types and ``a2a``/``allgather`` to the default plan (MLA a2a, Lightning allgather)."""
        if self.layer == "model":
            return (
                {"mla": "ring", "lightning": "ring"}
                if self.strategy == "ring"
                else {"mla": "a2a", "lightning": "allgather"}
            )
        return {self.layer: self.strategy}

    def model_config(self) -> ModelConfig:
        small = dict(kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
        layout = {"mla": "M", "lightning": "L", "model": "LMLM"}[self.layer]
        return ModelConfig(
            vocab_size=48,
            hidden_size=32,
            num_hidden_layers=len(layout),
            num_attention_heads=self.heads,
            layout=layout,
            **small,
            intermediate_size=40,
            max_position_embeddings=max(self.seq_len + 8, 16),
            head_dim=8,
            lightning_block_size=self.block_size,
        )

    def validate(self) -> None:
        problems = []
        if self.layer not in LAYERS:
            problems.append(f"layer must be one of {LAYERS} (got {self.layer!r})")
        if self.cp < 1 or self.dp < 1:
            problems.append(f"cp and dp must be >= 1 (got cp={self.cp}, dp={self.dp})")
        elif self.batch % self.dp:
            problems.append(f"batch {self.batch} does not split over dp={self.dp} data-parallel ranks")
        if self.heads < 1:
            problems.append(f"heads must be >= 1 (got {self.heads})")
        if self.seq_len <= self.left_pad:
            problems.append(f"seq_len {self.seq_len} must exceed the left padding of row 1 ({self.left_pad})")
        if problems:
            raise RingzeroError("; ".join(problems))
        cfg = self.model_config()
        probe = _build(self, cfg, torch.Generator().manual_seed(0), torch.float32, real=False)
        found = check_plan(probe, self.cp, self.plan(), self.sharding)
        if found:
            raise RingzeroError("; ".join(found))


def _build(spec: CheckSpec, cfg: ModelConfig, gen: torch.Generator, dtype: torch.dtype, real: bool = True):
    policy = PrecisionPolicy(
        body={torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype],
        attention_softmax_fp32=True,
        lm_head_fp32=True,
    )
    if spec.layer == "model":
        module = HybridLM(cfg, policy)
    else:
        cls = MLAttention if spec.layer == "mla" else LightningAttention
        module = cls(cfg, 0, policy).to(dtype)
    # Weights of order 1 (not a training init) so every path carries signal; drawn in fp64 then cast.
    return random_weights_(module, gen) if real else module


def _global_batch(spec: CheckSpec, cfg: ModelConfig, gen: torch.Generator, dtype: torch.dtype):
    B, S = spec.batch, spec.seq_len
    pos_BS = torch.arange(S).repeat(B, 1)
    if B > 1 and spec.left_pad:
        pos_BS[1] -= spec.left_pad  # row 1 left-padded: its first tokens are padding (negative)
    if spec.layer == "model":
        ids = torch.randint(0, cfg.vocab_size, (B, S + 1), generator=gen)
        return {"inputs": ids[:, :-1], "targets": ids[:, 1:], "positions": pos_BS}
    x = torch.randn((B, S, cfg.hidden_size), generator=gen, dtype=torch.float64).to(dtype)
    # Scaled so weight gradients (sums over all B*S tokens) are of order 1, like the outputs: the
    # absolute part of each dtype's tolerance assumes values of that size.
    dy = (torch.randn((B, S, cfg.hidden_size), generator=gen, dtype=torch.float64) / (B * S) ** 0.5).to(dtype)
    return {"inputs": x, "cotangent": dy, "positions": pos_BS}


def _step(module, batch, positions, real_BS, loss_fn):
    """Forward and backward; returns (output, loss, input grad or None)."""
    inputs = batch["inputs"]
    if inputs.is_floating_point():
        inputs = inputs.detach().requires_grad_(True)
    out = module(inputs, positions)
    if "targets" in batch:
        loss = loss_fn(-token_logprobs(out, batch["targets"]), real_BS)
    else:
        loss = (out * batch["cotangent"] * real_BS[..., None].to(out.dtype)).sum()
    loss.backward()
    return out.detach(), loss.detach(), (inputs.grad if inputs.is_floating_point() else None)


def _optimizer_step(module):
    """One step of the project's training optimizer (AdamW, fp32 masters, global-norm clipping)."""
    from ringzero.config.stages import OptimSettings
    from ringzero.engines.optimizer import TrainOptimizer

    opt = TrainOptimizer(module, OptimSettings(lr=1e-3, weight_decay=0.1), total_steps=1, schedule="constant")
    opt.step()
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def check_rank(ctx, spec: CheckSpec) -> dict | None:
    """Runs on every rank of a ``RankPool`` of ``spec.world_size`` ranks; rank 0 returns the report.

    With ``dp > 1`` each data-parallel replica takes its share of the batch rows; rank 0 compares the
    outputs of its own rows, and the loss, gradients and update of the whole batch."""
    P = spec.cp
    groups = ctx.groups(ParallelDims(dp=spec.dp, cp=P, world_size=spec.world_size))
    dtype = torch_dtype(spec.dtype)
    cfg = spec.model_config()
    gen = torch.Generator().manual_seed(spec.seed)
    base = _build(spec, cfg, gen, dtype)
    batch = _global_batch(spec, cfg, gen, dtype)
    layout = SeqLayout(spec.seq_len, P, spec.sharding)
    real_BS = batch["positions"] >= 0

    cp_module = copy.deepcopy(base)
    ledger = parallelize(cp_module, groups, spec.plan(), spec.sharding)
    me = groups.cp_rank
    rows = slice(groups.dp_rank * spec.batch // spec.dp, (groups.dp_rank + 1) * spec.batch // spec.dp)
    local = {k: layout.shard(v[rows], me, dim=1) for k, v in batch.items()}
    local_pos = layout.shard(batch["positions"][rows], me, dim=1, pad_value=-1)
    local_real = local_pos >= 0  # layout padding is marked -1 too: it never counts
    out_l, loss_l, dx_l = _step(
        cp_module, local, local_pos, local_real, lambda v, m: token_mean(v, m, groups)
    )
    sync_grads(cp_module.parameters(), groups)
    loss_cp = global_sum(loss_l, groups.dp_cp)
    out_cp = layout.gather(out_l, groups.cp)
    dx_cp = layout.gather(dx_l, groups.cp) if dx_l is not None else None
    grads_cp = {n: p.grad.clone() for n, p in cp_module.named_parameters()}
    updated_cp = _optimizer_step(cp_module) if spec.layer == "model" else None
    comm = ledger.metrics()
    if groups.rank != 0:
        return {"comm": comm}

    ref = copy.deepcopy(base)

    def ref_loss(v, m):
        return (v * m).sum() / m.sum()

    out_r, loss_r, dx_r = _step(ref, batch, batch["positions"], real_BS, ref_loss)
    grads_r = {n: p.grad.clone() for n, p in ref.named_parameters()}
    mine = real_BS.clone()
    mine[rows.stop :] = False  # rank 0's rows; real tokens only (padding outputs are not defined to match)
    report = {
        "output": compare(out_cp[mine[rows]], out_r[mine], dtype),
        "grads": {n: compare(grads_cp[n], grads_r[n], dtype) for n in grads_r},
    }
    if dx_r is not None:
        report["input_grad"] = compare(dx_cp[mine[rows]], dx_r[mine], dtype)
    if spec.layer == "model":
        report["loss"] = compare(loss_cp, loss_r, dtype)
        updated_r = _optimizer_step(ref)
        report["update"] = {n: compare(updated_cp[n], updated_r[n], dtype) for n in updated_r}
    report["comm"] = comm
    return report


def _flatten(report: dict) -> list[dict]:
    found = []
    for value in report.values():
        if isinstance(value, dict) and "ok" in value:
            found.append(value)
        elif isinstance(value, dict):
            found.extend(_flatten(value))
    return found


def summarize(spec: CheckSpec, per_rank: list[dict]) -> dict:
    """Rank 0's comparisons plus every rank's comm accounting, with the overall verdict."""
    report = dict(per_rank[0])
    comm_per_rank = [r["comm"] for r in per_rank]
    report.pop("comm")
    checks = _flatten(report)
    return {
        "spec": asdict(spec),
        "plan": spec.plan(),
        "ok": all(c["ok"] for c in checks),
        "max_abs": max(c["max_abs"] for c in checks),
        "max_rel": max(c["max_rel"] for c in checks),
        **report,
        "comm": comm_per_rank[0],
        "comm_per_rank": comm_per_rank,
    }


def run_check(spec: CheckSpec, pool=None) -> dict:
    """Validate ``spec``, run it on ``pool`` (or on freshly spawned gloo ranks) and summarise."""
    from ringzero.parallel.launch import RankPool

    spec.validate()
    if pool is not None:
        if pool.world_size != spec.world_size:
            raise RingzeroError(f"pool has {pool.world_size} ranks, the check needs dp*cp={spec.world_size}")
        return summarize(spec, pool.run(check_rank, spec))
    with RankPool(spec.world_size) as fresh:
        return summarize(spec, fresh.run(check_rank, spec))
