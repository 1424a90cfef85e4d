"""Lightning attention: causal linear attention with a per-head exponential decay (MiniMax-01, Ling 2.5).

    o_t = sum_{j<=t} exp(log_decay * (t - j)) (q_t . k_j) v_j        per head
    S_t = exp(log_decay) S_{t-1} + k_t^T v_t,   o_t = q_t S_t        (recurrent form, state dk x dv)

The layer (``LightningAttention``) is Ling 2.5's linear-attention layer, with the reference's names:
- one fused ``query_key_value`` projection, viewed ``[B, S, 3H, d]``: heads ``0..H-1`` are q, then k, then v;
- RMSNorm on each q and k head (``use_qk_norm``: ``query_layernorm``, ``key_layernorm``);
- RoPE (rotate-half) on the leading ``head_dim * partial_rotary_factor`` dims of each q/k head;
- q scaled by ``head_dim**-0.5`` before an unscaled core (flash-linear-attention's default scale in the HF
  reference; SGLang passes the same scale to its backend);
- decay per head from ALiBi slopes (with the reference's rule for head counts that are not powers of two)
  times a per-layer factor. The factor is SGLang's, ``1 - l / (L - 1) + 1e-5``: ringzero's rollout engine
  on a cluster is SGLang, and a decay that differs between the engines is a train/rollout gap built into
  the model. The HF reference uses ``1 - (l - 1) / (L - 1) + 1e-5`` (one layer shallower); see
  docs/ARCHITECTURE.md. A single-layer model (L = 1) has no depth to scale over: factor ``1 + 1e-5``;
- the output: ``g_norm`` (RMSNorm over ``group_norm_size`` equal groups of the ``H*d`` channels), times
  ``sigmoid(g_proj(x))`` of the layer input, then ``dense``;
- padding tokens (negative positions) get zero keys and values, so they never enter the state.

The state is kept in at least fp32 whatever the body dtype: it sums thousands of decayed outer products.

Letter legend: B batch, S sequence, H heads, k key/query head dim (dk), v value head dim (dv), D model.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.norms import GroupRMSNorm, RMSNorm
from ringzero.model.precision import at_least_fp32, state_dtype
from ringzero.model.rope import apply_rope, rope_cos_sin


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's head slopes: ``2**(-8 (h+1) / n)`` for a power of two ``n``; otherwise the slopes of the
    nearest lower power of two followed by every other slope of the next one (the reference's rule)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(lower) + alibi_slopes(2 * lower)[0::2][: n_heads - lower]


def layer_decay_factor(layer_idx: int, num_hidden_layers: int, rule: str = "sglang") -> float:
    """Per-layer scale of the slopes: SGLang's ``1 - l/(L-1) + 1e-5`` (what ringzero trains with) or the
    HF reference's ``1 - (l-1)/(L-1) + 1e-5``; ``1 + 1e-5`` for a one-layer model."""
    if num_hidden_layers == 1:
        return 1.0 + 1e-5
    shift = {"sglang": 0, "hf": 1}[rule]
    return 1.0 - (layer_idx - shift) / (num_hidden_layers - 1) + 1e-5


def decay_slopes(n_heads: int, layer_idx: int, num_hidden_layers: int, rule: str = "sglang") -> list[float]:
    """Positive per-head decay rates; the decay per token is ``exp(-slope)``."""
    factor = layer_decay_factor(layer_idx, num_hidden_layers, rule)
    return [slope * factor for slope in alibi_slopes(n_heads)]


def block_decays(ld_H: torch.Tensor, L: int):
    """Decay factors of a block of ``L`` tokens: ``(intra [H, L, L], query [H, L], key [H, L], state
    [H])``."""
    a = torch.arange(L, device=ld_H.device, dtype=ld_H.dtype)
    diff_LL = a[:, None] - a[None, :]
    intra_HLL = torch.exp(ld_H[:, None, None] * diff_LL.clamp(min=0)) * (diff_LL >= 0)
    return (
        intra_HLL,
        torch.exp(ld_H[:, None] * (a + 1)),
        torch.exp(ld_H[:, None] * (L - 1 - a)),
        torch.exp(ld_H * L),
    )


class DecayTables:
    """One layer's decay tensors, built once per (block length, device, dtype) from its float slopes.

    They depend on nothing but the fixed slopes, yet rebuilding them costs a handful of small kernels
    (and on a GPU a host-to-device copy of the slopes) per layer and forward. Entries made inside
    ``torch.inference_mode()`` are inference tensors, which autograd may not save, so the mode is part
    of the key. The last block of a sequence has any length below the block size: at most
    ``max_entries`` tables are kept, least recently used dropped first.
    """

    def __init__(self, slopes: list[float], dtype: torch.dtype, max_entries: int = 16):
        self.slopes, self.dtype, self.max_entries = tuple(slopes), dtype, max_entries
        self._tables: OrderedDict[tuple, object] = OrderedDict()

    def set_slopes(self, slopes) -> None:
        """New slopes: every cached table was built from the old ones."""
        self.slopes = tuple(float(x) for x in slopes)
        self._tables.clear()

    def log_decay(self, device=None) -> torch.Tensor:
        """``[H]`` in the layer's state dtype, from the floats: casting the module never rounds it."""
        return self._cached(
            ("log", device), lambda: -torch.tensor(self.slopes, dtype=self.dtype, device=device)
        )

    def block(self, L: int, device, dtype: torch.dtype):
        return self._cached(("block", L, device, dtype), lambda: block_decays(self._ld(device, dtype), L))

    def step(self, device, dtype: torch.dtype) -> torch.Tensor:
        """``exp(log_decay)`` ``[H, 1, 1]``: one recurrent step's decay."""
        return self._cached(
            ("step", device, dtype), lambda: torch.exp(self._ld(device, dtype))[:, None, None]
        )

    def _ld(self, device, dtype: torch.dtype) -> torch.Tensor:
        return self.log_decay(device).to(device=device, dtype=dtype)

    def _cached(self, key: tuple, build):
        key = (*key, torch.is_inference_mode_enabled())
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        value = self._tables[key] = build()
        if len(self._tables) > self.max_entries:
            self._tables.popitem(last=False)
        return value


def lightning_blocks(
    q, k, v, log_decay, block_size: int, initial_state=None, tables: DecayTables | None = None
):
    """Block-parallel form. q/k ``[B, S, H, dk]``, v ``[B, S, H, dv]``, log_decay ``[H]`` (<= 0).

    Returns ``(o [B, S, H, dv] in q's dtype, final_state [B, H, dk, dv] in at least fp32)``. Within a block
    of length L the intra part is a masked, decayed quadratic attention; the inter part reads the state
    carried from earlier blocks; then ``S <- exp(L ld) S + (K * exp((L-1-a) ld))^T V``. ``tables``: the
    layer's cached decays, which must be those of ``log_decay`` (the same tensors are built otherwise).
    """
    B, S, H, dk = q.shape
    dv = v.shape[-1]
    compute = at_least_fp32(q.dtype)
    if initial_state is not None:
        compute = torch.promote_types(compute, initial_state.dtype)
    q_BHSk, k_BHSk, v_BHSv = (t.to(compute).transpose(1, 2) for t in (q, k, v))
    ld_H = log_decay.to(device=q.device, dtype=compute)
    if initial_state is None:
        state_BHkv = q.new_zeros((B, H, dk, dv), dtype=compute)
    else:
        state_BHkv = initial_state.to(compute)
    outs = []
    for start in range(0, S, block_size):
        L = min(block_size, S - start)
        qb, kb, vb = (t[:, :, start : start + L] for t in (q_BHSk, k_BHSk, v_BHSv))
        decay_HLL, q_decay_HL, k_decay_HL, state_decay_H = (
            block_decays(ld_H, L) if tables is None else tables.block(L, q.device, compute)
        )
        intra = ((qb @ kb.transpose(-1, -2)) * decay_HLL) @ vb
        inter = (qb * q_decay_HL[..., None]) @ state_BHkv
        outs.append(intra + inter)
        state_BHkv = state_decay_H[:, None, None] * state_BHkv + (
            (kb * k_decay_HL[..., None]).transpose(-1, -2) @ vb
        )
    if outs:
        o_BHSv = torch.cat(outs, dim=2)
    else:
        o_BHSv = q_BHSk.new_zeros((B, H, 0, dv))
    return o_BHSv.transpose(1, 2).to(q.dtype), state_BHkv


def lightning_step(q_BHk, k_BHk, v_BHv, log_decay_H, state_BHkv, tables: DecayTables | None = None):
    """One recurrent decoding step: ``S <- exp(ld) S + k^T v``; ``o = q S``. Returns (o in q's dtype, S).

    Inside ``torch.inference_mode()`` the given state is updated in place and returned: a rollout engine
    decodes thousands of steps, and a fresh ``[B, H, dk, dv]`` state per token and layer costs more
    than the step's arithmetic. Elsewhere (autograd, tests) the input state is left untouched.
    ``tables``: the layer's cached decays, as in ``lightning_blocks``.
    """
    compute = state_BHkv.dtype
    q, k, v = q_BHk.to(compute), k_BHk.to(compute), v_BHv.to(compute)
    if tables is None:
        decay_H11 = torch.exp(log_decay_H.to(device=q_BHk.device, dtype=compute))[:, None, None]
    else:
        decay_H11 = tables.step(q_BHk.device, compute)
    if torch.is_inference_mode_enabled():
        state_BHkv = state_BHkv.mul_(decay_H11).addcmul_(k[..., :, None], v[..., None, :])
    else:
        state_BHkv = decay_H11 * state_BHkv + k[..., :, None] * v[..., None, :]
    o_BHv = torch.einsum("bhk,bhkv->bhv", q, state_BHkv)
    return o_BHv.to(q_BHk.dtype), state_BHkv


class LightningCore(nn.Module):
    """Single-device core (``parallelize`` swaps in a context-parallel one with the same call)."""

    def __init__(self, tables: DecayTables | None = None):
        super().__init__()
        self.tables = tables

    def forward(self, q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size: int):
        return lightning_blocks(q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size, tables=self.tables)[0]


class LightningAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, policy: PrecisionPolicy):
        super().__init__()
        self.num_attention_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.block_size = cfg.lightning_block_size
        self.rope_dim, self.rope_theta = cfg.linear_rope_dim, cfg.rope_theta
        self.state_dtype = state_dtype(policy)
        self.decays = DecayTables(
            decay_slopes(cfg.num_attention_heads, layer_idx, cfg.num_hidden_layers), self.state_dtype
        )
        inner = cfg.num_attention_heads * cfg.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * inner, bias=False)
        if cfg.use_qk_norm:
            self.query_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.key_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.query_layernorm = self.key_layernorm = None
        self.g_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.g_norm = GroupRMSNorm(cfg.group_norm_size, inner // cfg.group_norm_size, cfg.rms_norm_eps)
        self.dense = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.core = LightningCore(self.decays)

    @property
    def slopes(self) -> tuple[float, ...]:
        return self.decays.slopes

    @slopes.setter
    def slopes(self, slopes) -> None:  # other decay schedules (e.g. MiniMax's) are set after construction
        self.decays.set_slopes(slopes)

    def log_decay(self, device=None) -> torch.Tensor:
        """``[H]``, built from the floats (once per device), so casting the module never rounds the decay."""
        return self.decays.log_decay(device)

    def project(self, x_BSD: torch.Tensor, positions: torch.Tensor):
        """q, k, v ``[B, S, H, d]`` with norms, RoPE, q scaling and padding zeroed."""
        B, S, _ = x_BSD.shape
        H = self.num_attention_heads
        q, k, v = self.query_key_value(x_BSD).view(B, S, 3 * H, self.head_dim).split(H, dim=2)
        if self.query_layernorm is not None:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        if self.rope_dim:
            cos, sin = rope_cos_sin(positions, self.rope_dim, self.rope_theta, x_BSD.dtype)
            r = self.rope_dim
            q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)
            k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        q = q * self.head_dim**-0.5
        keep = (positions >= 0).to(x_BSD.dtype)
        keep = keep[None, :, None, None] if keep.dim() == 1 else keep[:, :, None, None]
        return q, k * keep, v * keep

    def finish(self, x_BSD: torch.Tensor, o_BSHv: torch.Tensor) -> torch.Tensor:
        o = self.g_norm(o_BSHv.flatten(2))
        return self.dense(torch.sigmoid(self.g_proj(x_BSD)) * o)

    def forward(self, x_BSD, positions, cache=None, key_positions=None):
        """Parallel form without ``cache``; with a ``LightningLayerCache`` it continues from its state."""
        q, k, v = self.project(x_BSD, positions)
        log_decay = self.log_decay(x_BSD.device)
        if cache is None:
            o = self.core(q, k, v, log_decay, self.block_size)
        elif q.shape[1] == 1:
            o, cache.state = lightning_step(q[:, 0], k[:, 0], v[:, 0], log_decay, cache.state, self.decays)
            o = o[:, None]
        else:
            o, cache.state = lightning_blocks(q, k, v, log_decay, self.block_size, cache.state, self.decays)
        return self.finish(x_BSD, o)
