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
    H, dn, dr, dv, r = layer.n_heads, layer.nope_dim, layer.rope_dim, layer.v_dim, layer.kv_lora_rank
    eps = layer.kv_a_norm.eps
    S = x_SD.shape[0]
    if layer.q_lora_rank is None:
        q = x_SD @ w(layer.q_proj.weight).T
    else:
        c_q = rms(x_SD @ w(layer.q_a_proj.weight).T, w(layer.q_a_norm.weight), eps)
        q = c_q @ w(layer.q_b_proj.weight).T
    q = q.view(S, H, dn + dr)
    kv_a = x_SD @ w(layer.kv_a_proj.weight).T
    c_kv = rms(kv_a[:, :r], w(layer.kv_a_norm.weight), eps)
    kv_b = w(layer.kv_b_proj.weight).view(H, dn + dv, r)
    qs, ks, vs = [], [], []
    for t in range(S):
        p = float(pos_S[t])
        k_rope = rope(kv_a[t, r:], p, layer.rope_theta)
        qs.append(torch.stack([torch.cat([q[t, h, :dn], rope(q[t, h, dn:], p, layer.rope_theta)]) for h in range(H)]))
        ks.append(torch.stack([torch.cat([kv_b[h, :dn] @ c_kv[t], k_rope]) for h in range(H)]))
        vs.append(torch.stack([kv_b[h, dn:] @ c_kv[t] for h in range(H)]))
    o, _ = softmax_attention(torch.stack(qs), torch.stack(ks), torch.stack(vs), pos_S, pos_S, (dn + dr) ** -0.5)
    return o.reshape(S, H * dv) @ w(layer.o_proj.weight).T


def lightning_layer(layer, x_SD, pos_S):
    """One row of a ``LightningAttention`` layer from the MiniMax-01 / Ling 2.5 formulas."""
    H, d, rd = layer.n_heads, layer.head_dim, layer.rope_dim
    S = x_SD.shape[0]
    q = (x_SD @ w(layer.q_proj.weight).T).view(S, H, d)
    k = (x_SD @ w(layer.k_proj.weight).T).view(S, H, d)
    v = (x_SD @ w(layer.v_proj.weight).T).view(S, H, d)
    if layer.q_norm is not None:
        q = rms(q, w(layer.q_norm.weight), layer.q_norm.eps)
        k = rms(k, w(layer.k_norm.weight), layer.k_norm.eps)
    for t in range(S):
        if rd:
            for h in range(H):
                q[t, h, :rd] = rope(q[t, h, :rd], float(pos_S[t]), layer.rope_theta)
                k[t, h, :rd] = rope(k[t, h, :rd], float(pos_S[t]), layer.rope_theta)
        if pos_S[t] < 0:  # padding never enters the state
            k[t] = 0
            v[t] = 0
    o, _ = decayed_linear_attention(q / math.sqrt(d), k, v, layer.slopes)
    if layer.out_norm is not None:
        o = rms(o, w(layer.out_norm.weight).view(H, d), layer.out_norm.eps)
    o = o.reshape(S, H * d)
    if layer.gate_proj is not None:
        o = torch.sigmoid(x_SD @ w(layer.gate_proj.weight).T) * o
    return o @ w(layer.o_proj.weight).T


def model_logits(model, ids_BS, pos_BS):
    """``HybridLM`` logits row by row from the reference layers."""
    out = []
    for b in range(ids_BS.shape[0]):
        x = w(model.embed.weight)[ids_BS[b]]
        for block in model.layers:
            h = rms(x, w(block.attn_norm.weight), block.attn_norm.eps)
            ref = mla_layer if block.kind == "mla" else lightning_layer
            x = x + ref(block.attn, h, pos_BS[b])
            h = rms(x, w(block.mlp_norm.weight), block.mlp_norm.eps)
            m = block.mlp
            x = x + (torch.nn.functional.silu(h @ w(m.gate_proj.weight).T) * (h @ w(m.up_proj.weight).T)) @ w(m.down_proj.weight).T
        h = rms(x, w(model.norm.weight), model.norm.eps)
        out.append(h @ w(model.head_weight).T)
    return torch.stack(out)
