"""A training step's activations, communication and time, per rank, from the model, the layout and the
stage's shape (``micro`` sequences of ``seq`` tokens a micro-batch, ``tokens`` a step).

**Activations** (bytes a token of a micro-batch keeps for its backward, per layer, ``a`` the body dtype's
bytes), as ringzero's layers save them (``tests/cost`` counts what autograd saves): both norms' fp32 input and
output and the linears' inputs ``16 D + 3 a D``; MLA the latent norm and rope key ``8 r + a r + 2 a dr`` and,
through a fused attention (``sdpa``), q, k, v and the output in fp32 ``16 H (dn + dr)``, or with the
``explicit`` core q, k, v in fp32 plus the fp32 scores and probabilities against the whole sequence and the
mask ``8 H S + S``; Lightning ``2 a D`` more, q, k, v, gate and their views in fp32 ``44 H d``, the block
scores ``4 H B`` and the chunk states ``4 H d^2 / B``; a dense MLP ``4 a I``; MoE per routed copy ``2 a D +
4 a Im + 4 D``, the router's fp32 input ``4 D`` and the shared expert ``4 a Im s``. Head-sized terms split
over TP, MoE's routed tokens too (each TP rank routes its slice), tokens over CP. ``recompute``: ``full``
keeps the layer input only; ``selective`` drops the explicit core's scores; ``none`` keeps all. Under 1F1B
pipeline stage ``i`` holds ``min(pp - i, micro-batches)`` micro-batches at once; the last stage adds the
chunked scorer's ``chunk x V / tp`` fp32 logits.

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
from ringzero.cost.params import attention_flops, count
from ringzero.model.config import ModelConfig, PrecisionPolicy

SCORER_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class StepShape:
    seq: int  # tokens a sequence (prompt + response)
    micro: int  # sequences a micro-batch, per data-parallel replica
    sequences: int  # sequences an optimizer step (the minibatch)
    scoring_passes: int = 0  # extra forwards without gradient (reference, old log-probs)
    recompute: str = "selective"  # none | selective | full


def layer_activation_bytes(
    cfg: ModelConfig, policy: PrecisionPolicy, layer: int, tp: int, seq: int, recompute: str
) -> float:
    """Bytes one token of a micro-batch keeps for layer ``layer``'s backward on one rank (``seq``: the whole
    sequence's tokens, which an explicit attention core's scores span), as ringzero's layers save them."""
    a, D, H = DTYPE_BYTES[policy.body], cfg.hidden_size, cfg.num_attention_heads // tp
    if recompute == "full":
        return D * a  # the layer's input; the rest is recomputed in the backward
    v = 4 * D * 4 + 3 * D * a  # both norms' fp32 input and output, the linears' inputs
    if cfg.layer_types()[layer] == "mla":
        dn, dr, dv, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        v += 2 * r * 4 + r * a + 2 * dr * a  # the latent's norm (fp32) and the rope key
        if cfg.mla_attention_impl == "sdpa":
            v += 4 * H * (dn + dr) * 4  # q, k, v (padded to the q/k width) and output, fp32 (the island)
        else:
            v += 2 * H * (dn + dr) * 4 + H * dv * 4  # q, k, v in fp32
            if recompute == "none":  # the scores and probabilities against the whole sequence, and the mask
                v += 2 * H * seq * 4 + seq
    else:
        d, B = cfg.head_dim, cfg.lightning_block_size
        v += (
            2 * D * a + (11 * H * d + H * B) * 4 + H * d * d * 4 / B
        )  # q, k, v, gate in fp32, block scores, states
    if cfg.is_moe_layer(layer):  # each TP rank routes its slice of the tokens
        k, Im, shared = cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.num_shared_experts or 0
        v += (k * (2 * D * a + 4 * Im * a + D * 4) + D * 4) / tp + 4 * Im * shared // tp * a
    else:
        v += 4 * cfg.intermediate_size // tp * a
    return v


def activation_bytes(
    cfg: ModelConfig, policy: PrecisionPolicy, layout: Layout, shape: StepShape, stage: int = 0
) -> int:
    """What one rank of pipeline stage ``stage`` keeps for its backward at the peak of a step."""
    tokens = shape.micro * shape.seq / layout.cp
    per = cfg.num_hidden_layers // layout.pp
    layers = range(stage * per, (stage + 1) * per)
    one = sum(layer_activation_bytes(cfg, policy, i, layout.tp, shape.seq, shape.recompute) for i in layers)
    in_flight = min(layout.pp - stage, max(1, shape.sequences // (shape.micro * layout.dp)))
    logits = SCORER_CHUNK_TOKENS * cfg.vocab_size // layout.tp * 4 if stage == layout.pp - 1 else 0
    return int(one * tokens * in_flight + logits)


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
    forward = 2 * count(cfg).active + attention_flops(cfg, shape.seq / 2)  # a token, mean context
    return shape.sequences * shape.seq * (3 + shape.scoring_passes) * forward


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
