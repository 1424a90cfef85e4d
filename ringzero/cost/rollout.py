"""A rollout replica's memory and speed bounds: how many sequences fit at a context length, and how fast
decoding and prefill can go at best.

- a replica is ``tp x pp`` GPUs (tp within a node, pp stages of layers across nodes, as SGLang serves a
  model larger than a node);
- **weights** per GPU: every parameter in the rollout policy's body dtype, split over the replica's GPUs
  (the LM head in fp32 under the LM-head island);
- **cache** per sequence: each MLA layer keeps ``r + dr`` latent values per token in the body dtype (SGLang's
  MLA cache, replicated on every TP rank, its layers split over PP); each Lightning layer one ``H x d x d``
  state in fp32, its heads split over TP. On one GPU equal to the embedded engine's ``StaticDecodeCache``
  buffers (``tests/cost``);
- **concurrent sequences** at context ``C``: ``(HBM x mem_fraction - weights) / cache(C)``;
- **decode roofline**: one step of ``B`` sequences reads the dense weights once, the routed experts the
  batch touches (``E (1 - (1 - k/E)^B)`` of them per MoE layer, uniform routing) and every sequence's cache;
  tokens/s <= ``B / (bytes / HBM bandwidth)``;
- **prefill bound**: ``2 x active parameters`` FLOPs a token plus attention (MLA: ``2 H (dn + dr + dv) x
  context`` a token; Lightning: ``4 H d^2`` a token), at the GPU's bf16 peak times ``mfu``.

These are bounds from the stated assumptions, not measurements: a GPU measures them (``bench/gpu``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.cost.gpus import Gpu
from ringzero.cost.memory import DTYPE_BYTES
from ringzero.cost.params import attention_flops, count
from ringzero.model.config import ModelConfig, PrecisionPolicy


@dataclass(frozen=True)
class RolloutPlan:
    tp: int
    pp: int
    weights_per_gpu: int
    cache_per_token: int  # MLA latent bytes a token adds, per GPU
    state_per_sequence: int  # Lightning state bytes a sequence holds, per GPU
    context: int
    max_sequences: int
    decode_tokens_per_s: float  # per replica, at max_sequences
    prefill_tokens_per_s: float  # per replica

    def cache_bytes(self, sequences: int, tokens: int) -> int:
        return sequences * (tokens * self.cache_per_token + self.state_per_sequence)

    def as_dict(self) -> dict:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "weights_per_gpu": self.weights_per_gpu,
            "cache_per_token": self.cache_per_token,
            "state_per_sequence": self.state_per_sequence,
            "context": self.context,
            "max_sequences": self.max_sequences,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
        }


def cache_per_token(cfg: ModelConfig, policy: PrecisionPolicy, pp: int = 1) -> int:
    mla = cfg.layer_types().count("mla")
    return -(-mla // pp) * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * DTYPE_BYTES[policy.body]


def state_per_sequence(cfg: ModelConfig, policy: PrecisionPolicy, tp: int = 1, pp: int = 1) -> int:
    lightning = cfg.layer_types().count("lightning")
    state = 8 if policy.body == "float64" else 4
    return -(-lightning // pp) * (cfg.num_attention_heads // tp) * cfg.head_dim * cfg.head_dim * state


def plan_rollout(
    cfg: ModelConfig,
    policy: PrecisionPolicy,
    gpu: Gpu,
    tp: int,
    context: int,
    *,
    pp: int = 1,
    mem_fraction: float = 0.9,
    mfu: float = 0.4,
) -> RolloutPlan:
    pc = count(cfg)
    body = DTYPE_BYTES[policy.body]
    head_extra = pc.head * (4 - body) if policy.lm_head_fp32 else 0
    weights = (pc.total * body + head_extra) // (tp * pp)
    per_token, per_seq = cache_per_token(cfg, policy, pp), state_per_sequence(cfg, policy, tp, pp)
    free = gpu.hbm_bytes * mem_fraction - weights
    sequences = max(0, int(free // (context * per_token + per_seq)))
    # decode: one step of B sequences at half the context on average
    B = max(1, sequences)
    touched = 0.0
    for la in pc.layers:
        if la.experts:
            touched += la.experts * (1 - (1 - pc.top_k / la.experts) ** B) * la.expert
    dense = pc.total - pc.routed
    # a decoding step passes through the pp stages one after the other: each reads its share
    read = (dense + touched) * body / (tp * pp) + B * (context / 2 * per_token + per_seq)
    decode = B / (pp * read / (gpu.hbm_tbs * 1e12)) if sequences else 0.0
    flops_per_token = 2 * pc.active + attention_flops(cfg, context / 2)
    prefill = tp * pp * gpu.flops("bf16") * mfu / flops_per_token
    return RolloutPlan(tp, pp, int(weights), per_token, per_seq, context, sequences, decode, prefill)
