"""Parallel form versus decoding forms on random weights: what ``ringzero check decode`` measures.

For a layer (MLA or Lightning) or the whole model, one left-padded batch of rows with different lengths
runs through the parallel (training) form once, and through two decoding schedules from an empty cache:
token by token, and chunked prefill (odd-sized chunks that straddle Lightning blocks) then decoding.
Outputs are compared on real (non-padding) tokens only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ringzero.model.cache import DecodeCache, LightningLayerCache, MLALayerCache, left_padded
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.lightning import LightningAttention
from ringzero.model.mla import MLAttention
from ringzero.model.precision import dtype_name, state_dtype
from ringzero.model.tolerances import compare


@torch.no_grad()
def random_weights_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Weights that make every path matter: matrices N(0, 1/fan_in) (activations of order 1, unlike a
    small training init), norm weights 1 + N(0, 0.1^2) so they are not the identity, and MoE routing
    biases (buffers) N(0, 0.05^2) so they steer the choice of experts. Buffers draw after every parameter,
    so a dense model's weights do not depend on them."""
    for p in module.parameters():
        if p.dim() == 1:
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator, dtype=torch.float64))
        else:
            std = 1 / math.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * std)
    for name, buf in module.named_buffers():
        if name.endswith("expert_bias"):
            buf.copy_(0.05 * torch.randn(buf.shape, generator=generator, dtype=torch.float64))
    return module


def _layer_cache(layer: nn.Module, batch: int, policy: PrecisionPolicy, dtype, capacity: int):
    if isinstance(layer, MLAttention):
        inner = MLALayerCache(batch, layer.latent_width, dtype, torch.device("cpu"), capacity)
    else:
        inner = LightningLayerCache(
            batch,
            layer.num_attention_heads,
            layer.head_dim,
            layer.head_dim,
            state_dtype(policy),
            torch.device("cpu"),
        )
    return DecodeCache([inner], batch, torch.device("cpu"), capacity)


def _run_schedule(step, n_cols: int, prefill: int, chunk: int) -> torch.Tensor:
    """Call ``step(start, end)`` over columns: chunks of ``chunk`` up to ``prefill``, then one by one."""
    outs, start = [], 0
    while start < n_cols:
        end = min(start + chunk, prefill) if start < prefill else start + 1
        outs.append(step(start, end))
        start = end
    return torch.cat(outs, dim=1)


@torch.no_grad()
def check_decode(
    kind: str, dtype: str, cfg: ModelConfig | None = None, seed: int = 0, seq_len: int | None = None
) -> dict:
    """Max abs/rel error between the parallel form and both decoding schedules; ``ok`` within tolerance."""
    cfg = cfg or ModelConfig()
    policy = PrecisionPolicy(body=dtype, attention_softmax_fp32=True, lm_head_fp32=True)
    tdtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
    gen = torch.Generator().manual_seed(seed)
    n_cols = seq_len or 2 * cfg.lightning_block_size + 5
    lengths = [n_cols, max(1, n_cols - 3), max(1, n_cols // 2 - 1)]
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    ids_BS, pos_BS = left_padded(prompts, pad_id=0)
    real_BS = pos_BS >= 0
    B = len(prompts)

    if kind == "model":
        model = random_weights_(HybridLM(cfg, policy), gen)
        reference = model(ids_BS, pos_BS)

        def fresh():
            cache = model.new_cache(B, capacity=4)  # small on purpose: the cache must grow
            return lambda s, e: model(ids_BS[:, s:e], pos_BS[:, s:e], cache)
    else:
        layer_cls = MLAttention if kind == "mla" else LightningAttention
        layer = random_weights_(layer_cls(cfg, cfg.num_hidden_layers - 1, policy).to(tdtype), gen)
        x_BSD = torch.randn((B, n_cols, cfg.hidden_size), generator=gen, dtype=torch.float64).to(tdtype)
        reference = layer(x_BSD, pos_BS)

        def fresh():
            cache = _layer_cache(layer, B, policy, tdtype, capacity=4)

            def step(s, e):
                keys = cache.append_positions(pos_BS[:, s:e])
                return layer(x_BSD[:, s:e], pos_BS[:, s:e], cache.layers[0], keys)

            return step

    forms = {
        "token_by_token": _run_schedule(fresh(), n_cols, prefill=0, chunk=1),
        "chunked_prefill": _run_schedule(fresh(), n_cols, prefill=n_cols // 2 + 3, chunk=7),
    }
    results = {name: compare(out[real_BS], reference[real_BS], tdtype) for name, out in forms.items()}
    return {
        "layer": kind,
        "dtype": dtype_name(tdtype),
        "seq_len": n_cols,
        "rows": lengths,
        "max_abs": max(r["max_abs"] for r in results.values()),
        "max_rel": max(r["max_rel"] for r in results.values()),
        "atol": results["token_by_token"]["atol"],
        "rtol": results["token_by_token"]["rtol"],
        "ok": all(r["ok"] for r in results.values()),
        "forms": results,
    }
