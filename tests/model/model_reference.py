"""Slow fp64 references written straight from the formulas, with explicit loops where the library uses
batched contractions. They read a module's parameters but share no code path with the module's forward.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def w(p: torch.Tensor) -> torch.Tensor:
    return p.detach().to(F64)


def rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rope(x, pos: float, theta: float):
    """Rotate pairs (x[i], x[i + d/2]) as complex numbers by angle pos * theta^(-2i/d)."""
    d = x.shape[-1]
    half = d // 2
    z = torch.complex(x[..., :half], x[..., half:])
    freqs = torch.tensor([pos * theta ** (-2 * i / d) for i in range(half)], dtype=F64)
    z = z * torch.polar(torch.ones_like(freqs), freqs)
    return torch.cat([z.real, z.imag], dim=-1)


def softmax_attention(q_QHD, k_KHD, v_KHE, q_pos, k_pos, scale):
    """Per query and head: softmax over visible keys (0 <= k_pos <= q_pos); no visible key -> zeros."""
    Q, H, _ = q_QHD.shape
    out = torch.zeros(Q, H, v_KHE.shape[-1], dtype=F64)
    lse = torch.full((Q, H), float("-inf"), dtype=F64)
    for i in range(Q):
        keys = [j for j in range(k_KHD.shape[0]) if 0 <= int(k_pos[j]) <= int(q_pos[i])]
        if not keys:
            continue
        for h in range(H):
            s = torch.stack([q_QHD[i, h] @ k_KHD[j, h] * scale for j in keys])
            m = s.max()
            e = torch.exp(s - m)
            out[i, h] = sum(e[n] / e.sum() * v_KHE[j, h] for n, j in enumerate(keys))
            lse[i, h] = m + torch.log(e.sum())
    return out, lse


def decayed_linear_attention(q_SHk, k_SHk, v_SHv, slopes, initial_state=None):
    """o_t = sum_{j<=t} exp(-slope (t-j)) (q_t . k_j) v_j  [+ exp(-slope (t+1)) q_t S0]; final state."""
    S, H, dk = q_SHk.shape
    dv = v_SHv.shape[-1]
    out = torch.zeros(S, H, dv, dtype=F64)
    state = torch.zeros(H, dk, dv, dtype=F64)
    for h in range(H):
        lam = math.exp(-slopes[h])
        for t in range(S):
            for j in range(t + 1):
                out[t, h] += lam ** (t - j) * (q_SHk[t, h] @ k_SHk[j, h]) * v_SHv[j, h]
            if initial_state is not None:
                out[t, h] += lam ** (t + 1) * (q_SHk[t, h] @ initial_state[h])
        for j in range(S):
            state[h] += lam ** (S - 1 - j) * torch.outer(k_SHk[j, h], v_SHv[j, h])
        if initial_state is not None:
            state[h] += lam**S * initial_state[h]
    return out, state


def mla_layer(layer, x_SD, pos_S):
    """One row of an ``MLAttention`` layer from the DeepSeek-V2 formulas (materialised per-head K/V)."""
    H, dn, dr, dv, r = (
        layer.num_attention_heads,
        layer.nope_dim,
        layer.rope_dim,
        layer.v_dim,
        layer.kv_lora_rank,
    )
    eps = layer.kv_a_layernorm.eps
    S = x_SD.shape[0]
    if layer.q_lora_rank is None:
        q = x_SD @ w(layer.q_proj.weight).T
    else:
        c_q = rms(x_SD @ w(layer.q_a_proj.weight).T, w(layer.q_a_layernorm.weight), eps)
        q = c_q @ w(layer.q_b_proj.weight).T
    q = q.view(S, H, dn + dr)
    kv_a = x_SD @ w(layer.kv_a_proj_with_mqa.weight).T
    c_kv = rms(kv_a[:, :r], w(layer.kv_a_layernorm.weight), eps)
    if layer.rope_interleave:  # stored pairs (x[2i], x[2i+1]) -> rotate-half pairs (x[i], x[i + dr/2])
        order = list(range(0, dr, 2)) + list(range(1, dr, 2))
        q = torch.cat([q[..., :dn], q[..., dn:][..., order]], dim=-1)
        kv_a = torch.cat([kv_a[:, :r], kv_a[:, r:][:, order]], dim=-1)
    kv_b = w(layer.kv_b_proj.weight).view(H, dn + dv, r)
    qs, ks, vs = [], [], []
    for t in range(S):
        p = float(pos_S[t])
        k_rope = rope(kv_a[t, r:], p, layer.rope_theta)
        qs.append(
            torch.stack(
                [torch.cat([q[t, h, :dn], rope(q[t, h, dn:], p, layer.rope_theta)]) for h in range(H)]
            )
        )
        ks.append(torch.stack([torch.cat([kv_b[h, :dn] @ c_kv[t], k_rope]) for h in range(H)]))
        vs.append(torch.stack([kv_b[h, dn:] @ c_kv[t] for h in range(H)]))
    o, _ = softmax_attention(
        torch.stack(qs), torch.stack(ks), torch.stack(vs), pos_S, pos_S, (dn + dr) ** -0.5
    )
    return o.reshape(S, H * dv) @ w(layer.dense.weight).T


def lightning_layer(layer, x_SD, pos_S):
    """One row of a ``LightningAttention`` layer from the MiniMax-01 / Ling 2.5 formulas."""
    H, d, rd = layer.num_attention_heads, layer.head_dim, layer.rope_dim
    S = x_SD.shape[0]
    qkv = (x_SD @ w(layer.query_key_value.weight).T).view(S, 3, H, d)  # heads: all q, then k, then v
    q, k, v = qkv[:, 0].clone(), qkv[:, 1].clone(), qkv[:, 2].clone()
    if layer.query_layernorm is not None:
        q = rms(q, w(layer.query_layernorm.weight), layer.query_layernorm.eps)
        k = rms(k, w(layer.key_layernorm.weight), layer.key_layernorm.eps)
    for t in range(S):
        if rd:
            for h in range(H):
                q[t, h, :rd] = rope(q[t, h, :rd], float(pos_S[t]), layer.rope_theta)
                k[t, h, :rd] = rope(k[t, h, :rd], float(pos_S[t]), layer.rope_theta)
        if pos_S[t] < 0:  # padding never enters the state
            k[t] = 0
            v[t] = 0
    o, _ = decayed_linear_attention(q / math.sqrt(d), k, v, layer.slopes)
    G = layer.g_norm.n_groups  # group RMSNorm over G equal slices of the H*d channels
    o = rms(o.reshape(S, G, H * d // G), w(layer.g_norm.weight).view(G, -1), layer.g_norm.eps).reshape(
        S, H * d
    )
    o = torch.sigmoid(x_SD @ w(layer.g_proj.weight).T) * o
    return o @ w(layer.dense.weight).T


def swiglu(m, h):
    return (torch.nn.functional.silu(h @ w(m.gate_proj.weight).T) * (h @ w(m.up_proj.weight).T)) @ w(
        m.down_proj.weight
    ).T


def moe(m, h_SD):
    """Token by token: sigmoid scores, grouped top-k on score + bias, renormalized unbiased weights."""
    out = torch.zeros_like(h_SD)
    E, G = m.num_experts, m.n_group
    for t in range(h_SD.shape[0]):
        scores = torch.sigmoid(w(m.gate.weight) @ h_SD[t])
        routing = scores + (0 if m.gate.expert_bias is None else w(m.gate.expert_bias))
        group_score = [sorted(routing[g * E // G : (g + 1) * E // G].tolist())[-2:] for g in range(G)]
        groups = sorted(range(G), key=lambda g: -sum(group_score[g]))[: m.topk_group]
        allowed = [e for e in range(E) if e // (E // G) in groups]
        chosen = sorted(allowed, key=lambda e: -float(routing[e]))[: m.top_k]
        weights = (
            scores[chosen] / (scores[chosen].sum() + 1e-20) if m.normalize and m.top_k > 1 else scores[chosen]
        )
        for e, wt in zip(chosen, weights * m.scaling, strict=True):
            out[t] += wt * swiglu(m.experts[e], h_SD[t : t + 1])[0]
    if m.shared_experts is not None:
        out += swiglu(m.shared_experts, h_SD)
    return out


def model_logits(model, ids_BS, pos_BS):
    """``HybridLM`` logits row by row from the reference layers."""
    out = []
    for b in range(ids_BS.shape[0]):
        x = w(model.word_embeddings.weight)[ids_BS[b]]
        for block in model.layers:
            h = rms(x, w(block.input_layernorm.weight), block.input_layernorm.eps)
            ref = mla_layer if block.kind == "mla" else lightning_layer
            x = x + ref(block.attention, h, pos_BS[b])
            h = rms(x, w(block.post_attention_layernorm.weight), block.post_attention_layernorm.eps)
            x = x + (moe(block.mlp, h) if hasattr(block.mlp, "gate") else swiglu(block.mlp, h))
        h = rms(x, w(model.norm.weight), model.norm.eps)
        out.append(h @ w(model.head_weight).T)
    return torch.stack(out)
