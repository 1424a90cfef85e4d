"""Test-side independent implementation of the published Ling 2.5 / Ring 2.5 architecture
(``BailingMoeV2_5ForCausalLM``), written from the architecture description in plain PyTorch and fp64,
readable over fast. Tests use it to cross-check the project's model. It deliberately shares no code with
the ``ringzero`` package (nothing from it is imported here).

Covered: the HF folder layout (config.json, safetensors with the reference tensor names, sharded with an
index or single-file, generation_config.json) and a full-sequence forward from position 0 with no padding,
no cache and no MTP layers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

F64 = torch.float64
SHARD_ABOVE = 64  # more tensors than this (and no max_shard_tensors given): shards of this many tensors


def tiny_config(**overrides) -> dict:
    cfg = dict(
        vocab_size=48,
        hidden_size=32,
        num_hidden_layers=4,
        layer_group_size=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
        partial_rotary_factor=0.5,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        kv_lora_rank=12,
        q_lora_rank=None,
        intermediate_size=40,
        hidden_act="silu",
        use_qk_norm=True,
        group_norm_size=2,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_interleave=True,
        tie_word_embeddings=False,
        num_experts=None,
        first_k_dense_replace=1,
        moe_intermediate_size=16,
        num_experts_per_tok=2,
        num_shared_experts=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.0,
        norm_topk_prob=True,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    cfg.update(overrides)
    if "num_key_value_heads" not in overrides:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    return cfg


def tiny_moe_config(**overrides) -> dict:
    return tiny_config(
        **{"num_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2, **overrides}
    )


# ----------------------------------------------------------------------------------------------- layout


def layer_types(cfg: dict) -> list[str]:
    """'attention' (MLA) for every layer_group_size-th layer and for the tail past the last full group."""
    L, G = cfg["num_hidden_layers"], cfg["layer_group_size"]
    return ["attention" if (i + 1) % G == 0 or i >= L // G * G else "linear_attention" for i in range(L)]


def is_moe_layer(cfg: dict, i: int) -> bool:
    return cfg.get("num_experts") is not None and i >= cfg.get("first_k_dense_replace", 0)


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _has_shared(cfg: dict) -> bool:
    return bool(cfg.get("num_shared_experts"))  # None or 0: no shared experts


def reference_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the reference checkpoint, by name, in a fixed order."""
    D, H, V, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"], _head_dim(cfg)
    nope, rope, vd, r = (
        cfg["qk_nope_head_dim"],
        cfg["qk_rope_head_dim"],
        cfg["v_head_dim"],
        cfg["kv_lora_rank"],
    )
    shapes: dict[str, tuple[int, ...]] = {"model.word_embeddings.weight": (V, D)}

    def mlp(prefix: str, inter: int) -> None:
        shapes[prefix + "gate_proj.weight"] = (inter, D)
        shapes[prefix + "up_proj.weight"] = (inter, D)
        shapes[prefix + "down_proj.weight"] = (D, inter)

    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (D,)
        shapes[p + "post_attention_layernorm.weight"] = (D,)
        a = p + "attention."
        if kind == "linear_attention":
            shapes[a + "query_key_value.weight"] = (3 * H * hd, D)
            if cfg.get("use_qk_norm"):
                shapes[a + "query_layernorm.weight"] = (hd,)
                shapes[a + "key_layernorm.weight"] = (hd,)
            shapes[a + "g_proj.weight"] = (H * hd, D)
            shapes[a + "g_norm.weight"] = (H * hd,)
            shapes[a + "dense.weight"] = (D, H * hd)
        else:
            if cfg.get("q_lora_rank") is None:
                shapes[a + "q_proj.weight"] = (H * (nope + rope), D)
            else:
                shapes[a + "q_a_proj.weight"] = (cfg["q_lora_rank"], D)
                shapes[a + "q_a_layernorm.weight"] = (cfg["q_lora_rank"],)
                shapes[a + "q_b_proj.weight"] = (H * (nope + rope), cfg["q_lora_rank"])
            shapes[a + "kv_a_proj_with_mqa.weight"] = (r + rope, D)
            shapes[a + "kv_a_layernorm.weight"] = (r,)
            shapes[a + "kv_b_proj.weight"] = (H * (nope + vd), r)
            shapes[a + "dense.weight"] = (D, H * vd)
        if is_moe_layer(cfg, i):
            E, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (E, D)
            shapes[p + "mlp.gate.expert_bias"] = (E,)
            for e in range(E):
                mlp(f"{p}mlp.experts.{e}.", inter)
            if _has_shared(cfg):
                mlp(p + "mlp.shared_experts.", inter * cfg["num_shared_experts"])
        else:
            mlp(p + "mlp.", cfg["intermediate_size"])
    shapes["model.norm.weight"] = (D,)
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, D)
    return shapes


def random_reference_tensors(cfg: dict, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Matrices N(0, 1/fan_in), norm weights 1 + N(0, 0.1^2), expert_bias N(0, 0.1^2); drawn in fp64."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in reference_tensor_shapes(cfg).items():
        x = torch.randn(shape, generator=gen, dtype=F64)
        if len(shape) == 2:
            x = x / math.sqrt(shape[1])
        elif name.endswith("expert_bias"):
            x = 0.1 * x
        else:
            x = 1.0 + 0.1 * x
        out[name] = x.to(dtype).contiguous()
    return out


def write_reference_folder(
    path, config: dict, seed: int, dtype=torch.float32, max_shard_tensors: int | None = None
) -> dict[str, torch.Tensor]:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = random_reference_tensors(config, seed, dtype)
    meta = {
        **config,
        "architectures": ["BailingMoeV2_5ForCausalLM"],
        "model_type": "bailing_moe_v2_5",
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (path / "config.json").write_text(json.dumps(meta, indent=2))
    gen_cfg = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    (path / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))

    names = list(tensors)
    if max_shard_tensors is None and len(names) <= SHARD_ABOVE:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return tensors
    per = max_shard_tensors or SHARD_ABOVE
    chunks = [names[j : j + per] for j in range(0, len(names), per)]
    weight_map = {}
    for k, chunk in enumerate(chunks, start=1):
        fname = f"model-{k:05d}-of-{len(chunks):05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return tensors


def read_folder(path) -> tuple[dict, dict[str, torch.Tensor]]:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return config, load_file(str(path / "model.safetensors"))
    tensors = {}
    for fname in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        tensors.update(load_file(str(path / fname)))
    return config, tensors


# ---------------------------------------------------------------------------------------------- forward


def lin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.T


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def swiglu(x: torch.Tensor, W: dict, prefix: str) -> torch.Tensor:
    gate = torch.nn.functional.silu(lin(x, W[prefix + "gate_proj.weight"]))
    return lin(gate * lin(x, W[prefix + "up_proj.weight"]), W[prefix + "down_proj.weight"])


def rope_rotate_half(x: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX RoPE on x [B, S, heads, d] at positions 0..S-1: pairs (x[i], x[i + d/2]), frequency
    theta^(-2i/d)."""
    S, d = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=F64) / d)
    freqs = torch.arange(S, dtype=F64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Reorder the last dim [0, 1, 2, 3, ...] -> [0, 2, 4, ..., 1, 3, 5, ...]."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(*x.shape[:-1], d)


def alibi_slopes(n: int) -> list[float]:
    """ALiBi / Lightning-Attention head slopes, with the non-power-of-two workaround."""

    def power_of_2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


def linear_attention_slopes(cfg: dict, layer: int, slope_rule: str = "sglang") -> torch.Tensor:
    """Per-head decay rates (the state decays by exp(-slope) per step). The HF file scales the base slopes by
    1 - (i - 1) / (L - 1) + 1e-5; SGLang (and the published serving path) by 1 - i / (L - 1) + 1e-5."""
    L = cfg["num_hidden_layers"]
    if L < 2:
        raise ValueError("the layer factor of the slopes needs num_hidden_layers > 1")
    offset = {"hf": layer - 1, "sglang": layer}.get(slope_rule)
    if offset is None:
        raise ValueError(f"slope_rule must be 'hf' or 'sglang', not {slope_rule!r}")
    return torch.tensor(alibi_slopes(cfg["num_attention_heads"]), dtype=F64) * (1 - offset / (L - 1) + 1e-5)


def lightning_recurrence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor
) -> torch.Tensor:
    """q, k [B, S, H, dk], v [B, S, H, dv], slope [H]: S_t = exp(-slope) S_{t-1} + k_t^T v_t, o_t = q_t
    S_t."""
    B, S, H, dk = q.shape
    state = torch.zeros(B, H, dk, v.shape[-1], dtype=F64)
    decay = torch.exp(-slope)[None, :, None, None]
    out = []
    for t in range(S):
        state = decay * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhd,bhde->bhe", q[:, t], state))
    return torch.stack(out, dim=1)


def linear_attention(
    cfg: dict, W: dict, p: str, x: torch.Tensor, layer: int, slope_rule: str
) -> torch.Tensor:
    B, S, _ = x.shape
    H, hd, eps = cfg["num_attention_heads"], _head_dim(cfg), cfg["rms_norm_eps"]
    q, k, v = lin(x, W[p + "query_key_value.weight"]).view(B, S, 3 * H, hd).split(H, dim=2)
    if cfg.get("use_qk_norm"):
        q, k = (
            rms_norm(q, W[p + "query_layernorm.weight"], eps),
            rms_norm(k, W[p + "key_layernorm.weight"], eps),
        )
    rd = int(hd * cfg.get("partial_rotary_factor", 1.0))
    q = torch.cat([rope_rotate_half(q[..., :rd], cfg["rope_theta"]), q[..., rd:]], dim=-1)
    k = torch.cat([rope_rotate_half(k[..., :rd], cfg["rope_theta"]), k[..., rd:]], dim=-1)
    o = lightning_recurrence(q * hd**-0.5, k, v, linear_attention_slopes(cfg, layer, slope_rule))
    groups = cfg["group_norm_size"]  # the number of channel groups, each normalized on its own
    o = rms_norm(o.reshape(B, S, groups, H * hd // groups), 1.0, eps).reshape(B, S, H * hd)
    o = o * W[p + "g_norm.weight"] * torch.sigmoid(lin(x, W[p + "g_proj.weight"]))
    return lin(o, W[p + "dense.weight"])


def mla_attention(cfg: dict, W: dict, p: str, x: torch.Tensor, norm_eps: float) -> torch.Tensor:
    B, S, _ = x.shape
    H, nope, rope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    vd, r = cfg["v_head_dim"], cfg["kv_lora_rank"]
    if cfg.get("q_lora_rank") is None:
        q = lin(x, W[p + "q_proj.weight"])
    else:
        q = lin(
            rms_norm(lin(x, W[p + "q_a_proj.weight"]), W[p + "q_a_layernorm.weight"], norm_eps),
            W[p + "q_b_proj.weight"],
        )
    q_nope, q_rope = q.view(B, S, H, nope + rope).split([nope, rope], dim=-1)
    c, k_rope = lin(x, W[p + "kv_a_proj_with_mqa.weight"]).split([r, rope], dim=-1)
    kv = lin(rms_norm(c, W[p + "kv_a_layernorm.weight"], norm_eps), W[p + "kv_b_proj.weight"])
    k_nope, v = kv.view(B, S, H, nope + vd).split([nope, vd], dim=-1)
    k_rope = k_rope[:, :, None, :]  # one rope key head shared by all heads
    if cfg.get("rope_interleave", True):
        q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
    q_rope, k_rope = rope_rotate_half(q_rope, cfg["rope_theta"]), rope_rotate_half(k_rope, cfg["rope_theta"])
    q = torch.cat([q_nope, q_rope], dim=-1)
    k = torch.cat([k_nope, k_rope.expand(B, S, H, rope)], dim=-1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (nope + rope) ** -0.5
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return lin(torch.einsum("bhqk,bkhe->bqhe", probs, v).reshape(B, S, H * vd), W[p + "dense.weight"])


def route(cfg: dict, x: torch.Tensor, gate_w: torch.Tensor, expert_bias: torch.Tensor):
    """x [N, D] -> (expert indices [N, top_k] in descending routing-score order, weights [N, top_k])."""
    E, top_k = cfg["num_experts"], cfg["num_experts_per_tok"]
    G, keep = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    scores = torch.sigmoid(lin(x, gate_w))
    routing = (scores + expert_bias).view(-1, G, E // G)
    group_score = routing.topk(min(2, E // G), dim=-1).values.sum(-1)
    allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter(
        1, group_score.topk(keep, dim=-1).indices, True
    )
    routing = routing.masked_fill(~allowed[:, :, None], float("-inf")).view(-1, E)
    idx = routing.topk(top_k, dim=-1).indices
    weights = scores.gather(1, idx)  # the unbiased scores: the bias only steers the choice
    if cfg.get("norm_topk_prob", True) and top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return idx, weights * cfg.get("routed_scaling_factor", 1.0)


def moe_mlp(cfg: dict, W: dict, p: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, S, D] -> (output [B, S, D], chosen experts [B, S, top_k])."""
    flat = x.reshape(-1, x.shape[-1])
    idx, weights = route(cfg, flat, W[p + "gate.weight"], W[p + "gate.expert_bias"])
    y = torch.zeros_like(flat)
    for e in range(cfg["num_experts"]):
        w_e = (weights * (idx == e)).sum(-1)
        rows = (idx == e).any(-1)
        if rows.any():
            y[rows] += w_e[rows, None] * swiglu(flat[rows], W, f"{p}experts.{e}.")
    if _has_shared(cfg):
        y = y + swiglu(flat, W, p + "shared_experts.")
    return y.view_as(x), idx.view(*x.shape[:-1], -1)


def reference_logits(
    config: dict,
    tensors: dict,
    input_ids: torch.Tensor,
    slope_rule: str = "sglang",
    mla_norm_eps: float | None = None,
    return_routing: bool = False,
):
    """fp64 logits [B, S, V] of input_ids [B, S]; with return_routing also {moe layer index: experts [B, S,
    k]}.

    mla_norm_eps is the eps of q_a_layernorm / kv_a_layernorm. None means rms_norm_eps, as SGLang does; the
    HF modeling file builds those two norms with its default eps 1e-6 whatever rms_norm_eps says.
    """
    cfg = config
    if cfg.get("rope_scaling") or cfg.get("use_qkv_bias") or cfg.get("use_bias"):
        raise NotImplementedError("rope_scaling and biases are not part of this reference")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError("only the silu activation")
    W = {k: v.to(F64) for k, v in tensors.items()}
    eps = cfg["rms_norm_eps"]
    mla_eps = eps if mla_norm_eps is None else mla_norm_eps
    x = W["model.word_embeddings.weight"][input_ids]
    routing = {}
    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        if kind == "attention":
            x = x + mla_attention(cfg, W, p + "attention.", h, mla_eps)
        else:
            x = x + linear_attention(cfg, W, p + "attention.", h, i, slope_rule)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if is_moe_layer(cfg, i):
            y, routing[i] = moe_mlp(cfg, W, p + "mlp.", h)
        else:
            y = swiglu(h, W, p + "mlp.")
        x = x + y
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.word_embeddings.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    logits = lin(x, head)
    return (logits, routing) if return_routing else logits
