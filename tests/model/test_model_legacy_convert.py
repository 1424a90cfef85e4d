"""``ringzero convert``: a checkpoint of ringzero's earlier format (RingzeroHybridLM) becomes Ling 2.5."""

from __future__ import annotations

import pytest
import torch
from model_kit import randomize, tiny_cfg

from ringzero.cli.main import main
from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.store import open_store

OLD_NAMES = [
    (".input_layernorm.", ".attn_norm."),
    (".post_attention_layernorm.", ".mlp_norm."),
    (".attention.query_layernorm.", ".attn.q_norm."),
    (".attention.key_layernorm.", ".attn.k_norm."),
    (".attention.g_norm.", ".attn.out_norm."),
    (".attention.g_proj.", ".attn.gate_proj."),
    (".attention.dense.", ".attn.o_proj."),
    (".attention.kv_a_proj_with_mqa.", ".attn.kv_a_proj."),
    (".attention.kv_a_layernorm.", ".attn.kv_a_norm."),
    (".attention.q_a_layernorm.", ".attn.q_a_norm."),
    (".attention.", ".attn."),
]


def _earlier_format(model: HybridLM):
    """The tensors and config.json the earlier ringzero wrote for the same model (written by hand here)."""
    cfg, tensors = model.cfg, {}
    for name, t in model.state_dict().items():
        name = name.replace("word_embeddings.", "embed.")
        if name.endswith("attention.query_key_value.weight"):
            q, k, v = t.chunk(3)
            base = name.replace(".attention.query_key_value.weight", ".attn.")
            tensors.update({base + "q_proj.weight": q, base + "k_proj.weight": k, base + "v_proj.weight": v})
            continue
        for new, old in OLD_NAMES:
            name = name.replace(new, old)
        tensors[name] = t.clone()
    old_model = {
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.hidden_size,
        "n_layers": cfg.num_hidden_layers,
        "n_heads": cfg.num_attention_heads,
        "layout": cfg.layout,
        "mla_every": cfg.layer_group_size,
        "mla": {
            "q_lora_rank": cfg.q_lora_rank,
            "kv_lora_rank": cfg.kv_lora_rank,
            "qk_nope_head_dim": cfg.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "v_head_dim": cfg.v_head_dim,
            "rope_theta": cfg.rope_theta,
            "attention_impl": "explicit",
        },
        "lightning": {
            "head_dim": cfg.head_dim,
            "block_size": cfg.lightning_block_size,
            "output_gate": True,
            "group_norm": True,
            "qk_norm": cfg.use_qk_norm,
            "rope_fraction": cfg.partial_rotary_factor,
            "rope_theta": cfg.rope_theta,
        },
        "mlp_hidden": cfg.intermediate_size,
        "tie_embeddings": cfg.tie_word_embeddings,
        "max_seq_len": cfg.max_position_embeddings,
        "norm_eps": cfg.rms_norm_eps,
        "init_std": cfg.initializer_range,
    }
    return tensors, {"architectures": ["RingzeroHybridLM"], "ringzero_format": 1, "ringzero_model": old_model}


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_convert_rewrites_an_earlier_checkpoint_exactly(tmp_path, capsys, q_lora_rank):
    # the earlier layer: rotate-half MLA RoPE and one output-norm group per head
    cfg = tiny_cfg(rope_interleave=False, group_norm_size=2, q_lora_rank=q_lora_rank)
    model = randomize(HybridLM(cfg, PrecisionPolicy.preset("fp32")))
    store = open_store(f"file://{tmp_path}/store")
    tensors, config = _earlier_format(model)
    store.save("old", tensors, config, {"step": 3})
    with pytest.raises(Exception, match="convert it once with `ringzero convert"):
        load_model("old", store=store)
    assert main(["convert", f"file://{tmp_path}/store/old", "--to", f"file://{tmp_path}/store/new"]) == 0
    assert "note: Lightning decay layer factor" in capsys.readouterr().out
    loaded = load_model("new", PrecisionPolicy.preset("fp32"), store=store)
    assert loaded.config == cfg and loaded.meta["step"] == 3
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in model.state_dict().items())
    assert main(["convert", f"file://{tmp_path}/store/new", "--to", f"file://{tmp_path}/store/again"]) == 2
