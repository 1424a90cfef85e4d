"""One-way conversion of checkpoints in ringzero's earlier format (``RingzeroHybridLM``) to Ling 2.5.

The earlier format kept ringzero's own names: separate Lightning ``q/k/v_proj``, a per-head output norm
(``out_norm``), rotate-half MLA RoPE, and the config under ``ringzero_model`` with the old field names.
Conversion fuses ``q/k/v`` into ``query_key_value`` (heads stay in order), renames every module, sets
``group_norm_size`` to the head count (per-head groups, as before) and ``rope_interleave: false``. Two
things cannot carry over exactly and are reported: the layer factor of the Lightning decay (earlier
``1 - l/(L - 1 + 1e-5)``, now SGLang's ``1 - l/(L - 1)``: a relative change below 1e-5) and, for a head
count that is not a power of two, the head slopes (now ALiBi's rule). A model without the output gate
or the output norm has no Ling 2.5 form and is refused.
"""

from __future__ import annotations

import math
import re

import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig

_TOP = {
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "mla_every": "layer_group_size",
    "mlp_hidden": "intermediate_size",
    "tie_embeddings": "tie_word_embeddings",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "init_std": "initializer_range",
}
_RENAMES = [
    (r"^embed\.", "word_embeddings."),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.mlp_norm\.", ".post_attention_layernorm."),
    (r"\.attn\.", ".attention."),
    (r"\.attention\.q_norm\.", ".attention.query_layernorm."),
    (r"\.attention\.k_norm\.", ".attention.key_layernorm."),
    (r"\.attention\.out_norm\.", ".attention.g_norm."),
    (r"\.attention\.gate_proj\.", ".attention.g_proj."),
    (r"\.attention\.o_proj\.", ".attention.dense."),
    (r"\.attention\.kv_a_proj\.", ".attention.kv_a_proj_with_mqa."),
    (r"\.attention\.kv_a_norm\.", ".attention.kv_a_layernorm."),
    (r"\.attention\.q_a_norm\.", ".attention.q_a_layernorm."),
]


def is_legacy(config: dict) -> bool:
    return config.get("ringzero_format") is not None or "RingzeroHybridLM" in (
        config.get("architectures") or []
    )


def convert(
    config: dict, tensors: dict[str, torch.Tensor], source: str
) -> tuple[ModelConfig, dict, list[str]]:
    """``(ModelConfig, state dict under the new names, notes)`` of an earlier-format checkpoint."""
    old = dict(config.get("ringzero_model") or {})
    if not old:
        raise RingzeroError(
            f"{source}: no ringzero_model section: not a checkpoint of ringzero's earlier format"
        )
    mla, lin = dict(old.pop("mla", {})), dict(old.pop("lightning", {}))
    if not lin.get("output_gate", True) or not lin.get("group_norm", True):
        raise RingzeroError(
            f"{source}: the model has no Lightning output gate or output norm; Ling 2.5 has both"
        )
    if "rope_theta" in lin and "rope_theta" in mla and lin["rope_theta"] != mla["rope_theta"]:
        raise RingzeroError(
            f"{source}: Lightning and MLA RoPE bases differ ({lin['rope_theta']} vs "
            f"{mla['rope_theta']}); Ling 2.5 has one rope_theta"
        )
    fields = {_TOP.get(k, k): v for k, v in old.items()}
    fields.update({k: v for k, v in mla.items() if k != "rope_theta"})
    fields["mla_attention_impl"] = fields.pop("attention_impl", "explicit")
    heads = fields.get("num_attention_heads", 4)
    fields.update(
        head_dim=lin.get("head_dim", 32),
        lightning_block_size=lin.get("block_size", 64),
        use_qk_norm=lin.get("qk_norm", True),
        partial_rotary_factor=lin.get("rope_fraction", 0.5),
        group_norm_size=heads,
        rope_interleave=False,
        rope_theta=mla.get("rope_theta", lin.get("rope_theta", 10000.0)),
    )
    cfg = ModelConfig.model_validate(fields)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(("attn.k_proj.weight", "attn.v_proj.weight")):
            continue
        if name.endswith("attn.q_proj.weight") and name.replace("q_proj", "k_proj") in tensors:
            fused = torch.cat(
                [t, tensors[name.replace("q_proj", "k_proj")], tensors[name.replace("q_proj", "v_proj")]]
            )
            name, t = name.replace("q_proj", "query_key_value"), fused
        for pattern, repl in _RENAMES:
            name = re.sub(pattern, repl, name)
        out[name] = t
    notes = [
        "Lightning decay layer factor: 1 - l/(L-1+1e-5) -> SGLang's 1 - l/(L-1) (relative change < 1e-5)"
    ]
    if not math.log2(heads).is_integer():
        notes.append(
            f"{heads} heads is not a power of two: the Lightning head slopes now follow ALiBi's rule "
            f"and differ from the earlier 2**(-8(h+1)/H); expect a changed model"
        )
    return cfg, out, notes
