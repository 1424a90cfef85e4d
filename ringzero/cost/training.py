"""A training step's activations, communication and time, per rank, from the model, the layout and the
stage's shape (``micro`` sequences of ``seq`` tokens a micro-batch, ``tokens`` a step).

**Activations** (bytes a micro-batch keeps for its backward, per layer, in the body dtype ``a``): a
layer's input and both norm outputs (``3 D``), then per layer type the inputs its linears save and what the
attention keeps: MLA ``q`` ``H (dn + dr)``, latent ``r + dr``, up-projected ``H (dn + dv)``, output ``H dv``
(and, without a fused attention, the ``H S`` fp32 scores and probabilities a query keeps: the ``explicit``
core); Lightning ``q, k, v, gate, output, normed`` ``6 H d`` and one fp32 ``H d^2`` chunk state per
``lightning_block_size`` tokens; a dense MLP ``3 I``; MoE the router's fp32 scores ``4 E / a``, ``k``
dispatched copies of the token and of its output, and ``3 Im`` per copy (each TP rank routes its slice of
the tokens), plus the shared expert's ``3 Im s``. Head-sized terms split over TP (no sequence parallelism
outside MoE, as the megatron engine runs), tokens over CP. ``recompute``: ``full`` keeps the layer
input only; ``selective`` drops the attention scores; ``none`` keeps all. Under 1F1B pipeline stage
``i`` holds ``min(pp - i, micro-batches)`` micro-batches at once; the last stage adds the chunked
scorer's ``chunk x V / tp`` fp32 logits. Stated as an estimate: it is not yet checked against the bytes
autograd saves.

**Communication** (bytes one rank sends in a step; ring collectives move ``2 (n-1)/n`` of the buffer for an
all-reduce, ``(n-1)/n`` for a gather or reduce-scatter): TP two all-reduces of the ``D``-wide activations
per layer forward and two backward; CP an all-to-all of MLA's q, k, v and output and an all-gather of each
Lightning chunk state, forward and backward; EP the all-gather dispatch and reduce-scatter combine of each
MoE layer's tokens, forward and backward; PP one ``D``-wide activation and its gradient per micro-batch and
stage boundary; DP the gradient reduction (reduce-scatter plus all-gather of parameters with the
distributed optimizer), experts over their expert-data-parallel group; the weight push the whole model once
in bf16 to the rollout replicas.

**Time**: compute ``(6 x active + 6 x attention) FLOPs a token`` (forward and backward) plus ``2 x active`` a
token for each extra scoring pass (the reference's and the corrections' old log-probs), over the GPUs at the
bf16 peak times ``mfu`` (an input: published MoE trainings reach 25-28 %), a third more under full
recompute (a second forward), and the 1F1B bubble ``(pp - 1) / m`` of ``m`` micro-batches a step;
communication at NVLink speed within a node and the network's across nodes. The bound is their larger
(perfect overlap) and the sum (none).

Letter legend as in ``params``; a the body dtype's bytes, S sequence length, t tp, c cp, e ep, p pp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.cost.gpus import Gpu
from ringzero.cost.memory import DTYPE_BYTES, Layout
from ringzero.cost.params import count
from ringzero.model.config import ModelConfig, PrecisionPolicy

SCORER_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class StepShape:
    seq: int  # tokens a sequence (prompt + response)
    micro: int  # sequences a micro-batch, per data-parallel replica
    sequences: int  # sequences an optimizer step (the minibatch)
    scoring_passes: int = 0  # extra forwards without gradient (reference, old log-probs)
    recompute: str = "selective"  # none | selective | full


def activation_bytes(
    cfg: ModelConfig, policy: PrecisionPolicy, layout: Layout, shape: StepShape, stage: int = 0
) -> int:
    a = DTYPE_BYTES[policy.body]
    t, S = layout.tp, shape.seq / layout.cp
    D, H = cfg.hidden_size, cfg.num_attention_heads
    pc = count(cfg)
    tokens = shape.micro * S
    per_layer = []
    for i, layer in enumerate(pc.layers):
        if shape.recompute == "full":
            per_layer.append(D * a)
            continue
        v = 3 * D * a
        if layer.kind == "mla":
            dn, dr, dv, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
            v += (H * (dn + dr) + H * (dn + dv) + H * dv) // t * a + (r + dr) * a
            if shape.recompute == "none" and cfg.mla_attention_impl == "explicit":
                v += 2 * 4 * (H // t) * shape.seq  # fp32 scores and probabilities against the whole sequence
        else:
            inner = H * cfg.head_dim // t
            v += 6 * inner * a + 4 * inner * cfg.head_dim / cfg.lightning_block_size
        if cfg.is_moe_layer(i):  # each TP rank routes its slice of the tokens (the engine's MoE)
            k, Im = pc.top_k, cfg.moe_intermediate_size
            v += (4 * cfg.num_experts + 2 * k * D * a + 3 * k * Im * a) / t
            v += 3 * Im * (cfg.num_shared_experts or 0) // t * a
        else:
            v += 3 * cfg.intermediate_size // t * a
        per_layer.append(v)
    layers = len(pc.layers) // layout.pp
    in_flight = min(layout.pp - stage, max(1, shape.sequences // (shape.micro * layout.dp)))
    logits = SCORER_CHUNK_TOKENS * cfg.vocab_size // t * 4 if stage == layout.pp - 1 else 0
    return int(max(per_layer) * layers * tokens * in_flight + logits)


@dataclass(frozen=True)
class CommBytes:
    tp: float
    cp: float
    ep: float
    pp: float
    dp: float
    push: float

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("tp", "cp", "ep", "pp", "dp", "push")}


def comm_bytes(
    cfg: ModelConfig, policy: PrecisionPolicy, layout: Layout, shape: StepShape, grads: int
) -> CommBytes:
    """Bytes one rank sends in one optimizer step (``grads``: its gradient bytes)."""
    a = DTYPE_BYTES[policy.body]
    t, c, e, p = layout.tp, layout.cp, layout.ep, layout.pp
    D, H = cfg.hidden_size, cfg.num_attention_heads
    pc = count(cfg)
    kinds = cfg.layer_types()[: len(pc.layers) // p]  # one stage's share of the layers (their mix, roughly)
    tokens = shape.sequences * shape.seq / (layout.dp * c)  # tokens this rank's replica shard sees a step
    ring = lambda n: 2 * (n - 1) / n if n > 1 else 0.0  # noqa: E731 - all-reduce traffic factor
    share = lambda n: (n - 1) / n if n > 1 else 0.0  # noqa: E731 - gather / scatter / all-to-all factor
    tp = 4 * len(kinds) * tokens * D * a * ring(t)
    mla = (
        kinds.count("mla")
        * 4
        * tokens
        * (H // t)
        * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
        * a
    )
    lightning = (
        kinds.count("lightning") * 2 * (tokens / cfg.lightning_block_size) * (H // t) * cfg.head_dim**2 * 4
    )
    cp = (mla + lightning * c) * share(c)
    moe = sum(1 for i in range(len(kinds)) if cfg.is_moe_layer(i))
    ep = moe * 4 * tokens * D * a * share(e) * e
    micro_batches = max(1, shape.sequences // (shape.micro * layout.dp))
    pp = 2 * micro_batches * shape.micro * shape.seq / c * D * a if p > 1 else 0.0
    dp = grads * ring(layout.dp * c)
    push = pc.total * 2 / (t * p * layout.dp * c)  # each rank's share of one bf16 push
    return CommBytes(tp, cp, ep, pp, dp, push)


def step_flops(cfg: ModelConfig, shape: StepShape) -> float:
    """FLOPs of one optimizer step over its ``sequences`` (forward and backward, plus scoring passes)."""
    pc = count(cfg)
    kinds = cfg.layer_types()
    H = cfg.num_attention_heads
    mla = (
        kinds.count("mla")
        * 2
        * H
        * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
        * shape.seq
        / 2
    )
    lightning = kinds.count("lightning") * 4 * H * cfg.head_dim**2
    tokens = shape.sequences * shape.seq
    return tokens * (
        3 * (2 * pc.active + mla + lightning) + shape.scoring_passes * (2 * pc.active + mla + lightning)
    )


def step_time(
    cfg: ModelConfig,
    layout: Layout,
    shape: StepShape,
    comm: CommBytes,
    gpu: Gpu,
    gpus_per_node: int,
    mfu: float,
) -> dict[str, float]:
    # recomputation runs the forward again: all of it (full), or the attention core only (selective: small)
    again = {"none": 1.0, "selective": 1.0, "full": 4 / 3}[shape.recompute]
    micro_batches = max(1, shape.sequences // (shape.micro * layout.dp))
    bubble = 1 + (layout.pp - 1) / micro_batches
    compute = again * bubble * step_flops(cfg, shape) / (layout.gpus * gpu.flops("bf16") * mfu)
    nvlink, net = gpu.nvlink_gbs / 2 * 1e9, gpu.net_gbs * 1e9
    inner = layout.tp  # TP ranks are adjacent: within a node when tp <= gpus_per_node
    tp_bw = nvlink if inner <= gpus_per_node else net
    cp_bw = nvlink if inner * layout.cp <= gpus_per_node else net
    others = net if layout.gpus > gpus_per_node else nvlink
    seconds = comm.tp / tp_bw + comm.cp / cp_bw + (comm.ep + comm.pp + comm.dp) / others
    return {
        "compute": compute,
        "comm": seconds,
        "overlapped": max(compute, seconds),
        "serial": compute + seconds,
    }
