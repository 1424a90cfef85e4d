"""Bytes per GPU of a training rank, as the megatron engine shards the model (``engines.megatron.model``):

- **weights**: every linear weight split over TP (the embedding and head by vocabulary rows, MLA's
  ``q``/``kv_down``/``kv_up``/``proj``, Lightning's ``qkv``/``gate``/``dense`` and its group norm, dense and
  expert SwiGLUs by columns); the layer norms, Lightning's q/k norms, MLA's latent norm and the router
  replicated; routed experts split over EP (``E / ep`` per rank); layers over PP (``L / pp`` per stage,
  the embedding on the first stage, the final norm and head on the last). Dtypes as built: the body
  dtype of the training policy, layer norms in fp32, the head in fp32 under the LM-head island;
- **grads**: ringzero's optimizer keeps each parameter's gradient in its own dtype; megatron's distributed
  optimizer accumulates into one fp32 buffer (``grad_reduce_in_fp32``);
- **optimizer**: fp32 master copy, Adam first and second moments (12 bytes a parameter); with the
  distributed optimizer sharded over the data-parallel ranks that hold the same parameter (dp x cp for dense
  ones, dp x cp / ep for routed experts: the expert-data-parallel group), an fp32 parameter being its own
  master there (8 bytes); megatron's gradient buffer also pads each parameter's start (under 1% here);
- **activations**: ``training.activation_bytes``.

A stage's ranks differ (first stage: embedding, last: head); the plan reports the heaviest. Letter legend as
in ``params``; t tp, p pp, e ep.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.cost.params import count
from ringzero.model.config import ModelConfig, PrecisionPolicy

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
OPTIMIZER_BYTES = 12  # fp32 master + Adam m + v


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    dp: int = 1
    distributed_optimizer: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def label(self) -> str:
        opt = ",dist-opt" if self.distributed_optimizer else ""
        return f"tp={self.tp},pp={self.pp},ep={self.ep},cp={self.cp},dp={self.dp}{opt}"


@dataclass(frozen=True)
class Tensors:
    """A rank's parameters by what shards them: numel and bytes of its weights."""

    dense_numel: int  # every parameter but the routed experts
    dense_bytes: int
    expert_numel: int
    expert_bytes: int
    fp32_numel: int = 0  # of the dense ones, those held in fp32 (norm gains, the head under its island)

    @property
    def numel(self) -> int:
        return self.dense_numel + self.expert_numel

    @property
    def bytes(self) -> int:
        return self.dense_bytes + self.expert_bytes


def stage_tensors(cfg: ModelConfig, policy: PrecisionPolicy, layout: Layout, stage: int) -> Tensors:
    """The parameters one rank of pipeline stage ``stage`` holds."""
    t, body = layout.tp, DTYPE_BYTES[policy.body]
    head_bytes = 4 if policy.lm_head_fp32 else body
    pc = count(cfg)
    per = len(pc.layers) // layout.pp
    dense_n = dense_b = expert_n = expert_b = fp32_n = 0

    def add(numel: int, nbytes: int) -> None:
        nonlocal dense_n, dense_b, fp32_n
        dense_n, dense_b = dense_n + numel, dense_b + numel * nbytes
        fp32_n += numel if nbytes == 4 and body != 4 else 0

    if stage == 0:
        add(pc.embedding // t, body)
    if stage == layout.pp - 1:
        add(cfg.hidden_size, body)  # the final norm, in the body dtype
        add(pc.head // t, head_bytes)
    for i in range(stage * per, (stage + 1) * per):
        layer = pc.layers[i]
        add(layer.norms, 4)
        replicated = _replicated_attention(cfg, layer.kind)
        split = layer.attention - replicated
        if layer.kind == "lightning":
            inner = cfg.num_attention_heads * cfg.head_dim
            add((split - inner) // t, body)
            add(inner // t, 4)  # the group norm, split with its heads, fp32
        else:
            add(split // t, body)
        add(replicated, 4)  # head and latent norms, fp32
        add(layer.dense_mlp // t, body)
        add(layer.router, body)
        add(layer.shared // t, body)
        n = layer.experts // layout.ep * layer.expert // t
        expert_n, expert_b = expert_n + n, expert_b + n * body
    return Tensors(dense_n, dense_b, expert_n, expert_b, fp32_n)


def _replicated_attention(cfg: ModelConfig, kind: str) -> int:
    """The attention's norm gains every TP rank holds whole."""
    if kind == "mla":
        return cfg.kv_lora_rank + (cfg.q_lora_rank or 0)
    return 2 * cfg.head_dim if cfg.use_qk_norm else 0


@dataclass(frozen=True)
class RankBytes:
    weights: int
    grads: int
    optimizer: int
    activations: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "grads": self.grads,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
        }


def state_bytes(cfg: ModelConfig, policy: PrecisionPolicy, layout: Layout, stage: int) -> RankBytes:
    """Weights, gradients and optimizer state of one rank of ``stage`` (activations: zero here)."""
    tensors = stage_tensors(cfg, policy, layout, stage)
    if layout.distributed_optimizer:
        dense_dp = layout.dp * layout.cp
        expert_dp = max(1, dense_dp // layout.ep)
        grads = 4 * tensors.numel
        optimizer = OPTIMIZER_BYTES * (
            -(-tensors.dense_numel // dense_dp) + -(-tensors.expert_numel // expert_dp)
        )
    else:
        grads = tensors.bytes
        optimizer = OPTIMIZER_BYTES * tensors.numel
    return RankBytes(tensors.bytes, grads, optimizer)
