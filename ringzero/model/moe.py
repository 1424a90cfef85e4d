"""Ling 2.5's MoE MLP: sigmoid router with a routing-only expert bias, grouped top-k, shared experts.

    scores  = sigmoid(x W_gate^T)                          (fp32, ``router_dtype: fp32``)
    chosen  = grouped_topk(scores + expert_bias)            the bias steers the choice only
    weights = scores[chosen] / sum(scores[chosen]) * routed_scaling_factor   (renormalized when
              ``norm_topk_prob`` and more than one expert is chosen)
    y       = sum_k weights_k * expert_k(x) + shared_experts(x)

Grouped top-k (DeepSeek-V3's ``noaux_tc``, as the reference): experts form ``n_group`` equal groups, a
group scores by the sum of its two best routing scores, the ``topk_group`` best groups stay and the top
``num_experts_per_tok`` experts are taken among them. Everything is a function of the inputs: ``topk``
breaks ties by index, so routing is deterministic.

Routing replay: the rollout engine reports the experts it chose per token; rescoring with
``replay_routing`` forces the same choice while the weights still come from this forward's scores, so the
gradient flows through the router as usual (R3 in the literature).

The experts run as a loop over experts on the tokens routed to each: plain torch, enough for small
models; a grouped GEMM would replace the loop, not the routing. That loop's matmul shapes depend on how
many tokens chose each expert, so its last bits depend on the other tokens; ``fixed_shape_experts()``
runs every expert on every token instead and weights the results (zero for experts not chosen, an exact
zero added), so a token's output depends only on its own inputs: the batch-invariant forward of the
deterministic mode uses it.

Letter legend: N tokens, D model, E experts, K experts per token, G groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from ringzero.model.config import ModelConfig
from ringzero.model.mlp import SwiGLU
from ringzero.model.precision import at_least_fp32

_FIXED_SHAPE: ContextVar[bool] = ContextVar("fixed_shape_experts", default=False)


@contextmanager
def fixed_shape_experts() -> Iterator[None]:
    """Inside: every expert runs on every token (batch-invariant, E times the expert compute)."""
    token = _FIXED_SHAPE.set(True)
    try:
        yield
    finally:
        _FIXED_SHAPE.reset(token)


class MoEGate(nn.Module):
    """The router's weight ``[E, D]`` and its routing-only ``expert_bias`` ``[E]`` (reference names)."""

    def __init__(self, num_experts: int, hidden_size: int, with_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        # A buffer, not a parameter: the bias is set by load balancing between runs, never by gradients.
        self.register_buffer("expert_bias", torch.zeros(num_experts) if with_bias else None)

    def _apply(self, fn, recurse=True):
        # Follow the module's device but never round the bias to a bf16 body: a rounded bias can flip
        # which expert wins, and SGLang keeps it in fp32.
        bias = self.expert_bias
        super()._apply(fn, recurse)
        if bias is not None:
            self.expert_bias = bias.to(device=self.expert_bias.device, dtype=at_least_fp32(bias.dtype))
        return self


def grouped_topk(routing_NE: torch.Tensor, k: int, n_group: int, topk_group: int) -> torch.Tensor:
    """Indices ``[N, K]`` of the chosen experts, best first."""
    N, E = routing_NE.shape
    if n_group > 1:
        group_NG = routing_NE.view(N, n_group, E // n_group).topk(2, dim=-1).values.sum(-1)
        keep_NG = torch.zeros_like(group_NG, dtype=torch.bool)
        keep_NG.scatter_(1, group_NG.topk(topk_group, dim=-1).indices, True)
        routing_NE = routing_NE.masked_fill(~keep_NG.repeat_interleave(E // n_group, dim=1), float("-inf"))
    return routing_NE.topk(k, dim=-1).indices


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.n_group, self.topk_group = cfg.n_group, cfg.topk_group
        self.scaling, self.normalize = cfg.routed_scaling_factor, cfg.norm_topk_prob
        self.gate = MoEGate(cfg.num_experts, cfg.hidden_size, cfg.moe_router_enable_expert_bias)
        self.experts = nn.ModuleList(
            SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.num_experts)
        )
        shared = cfg.num_shared_experts or 0
        self.shared_experts = SwiGLU(cfg.hidden_size, cfg.moe_intermediate_size * shared) if shared else None
        self.replay: torch.Tensor | None = None  # [B, S, K] expert ids to use instead of routing
        self.record: list[torch.Tensor] | None = None  # [B, S, K] chosen ids of each forward, when capturing

    def route(self, x_ND: torch.Tensor):
        """``(chosen [N, K], weights [N, K] fp32)`` for tokens ``x_ND``."""
        compute = at_least_fp32(x_ND.dtype)
        scores_NE = torch.sigmoid(F.linear(x_ND.to(compute), self.gate.weight.to(compute)))
        if self.replay is not None:
            chosen = self.replay.to(x_ND.device).reshape(-1, self.replay.shape[-1])
            if chosen.shape != (x_ND.shape[0], self.top_k) or bool(
                ((chosen < 0) | (chosen >= self.num_experts)).any()
            ):
                raise ValueError(
                    f"routing replay: expected expert ids in [0, {self.num_experts}) for "
                    f"{x_ND.shape[0]} tokens x {self.top_k}, got shape {list(self.replay.shape)}"
                )
        else:
            bias = self.gate.expert_bias
            routing = scores_NE if bias is None else scores_NE + bias.to(compute)
            chosen = grouped_topk(routing, self.top_k, self.n_group, self.topk_group)
        weights = scores_NE.gather(1, chosen)
        if self.normalize and self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scaling

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        x_ND = x_BSD.reshape(-1, x_BSD.shape[-1])
        chosen_NK, weights_NK = self.route(x_ND)
        if self.record is not None:
            self.record.append(chosen_NK.detach().view(*x_BSD.shape[:-1], -1))
        # The weighted sum over a token's experts runs in the router's precision, as the reference's.
        out_ND = torch.zeros(x_ND.shape, dtype=weights_NK.dtype, device=x_ND.device)
        if _FIXED_SHAPE.get():
            dense_NE = torch.zeros(
                (x_ND.shape[0], self.num_experts), dtype=weights_NK.dtype, device=x_ND.device
            )
            dense_NE = dense_NE.scatter_add(1, chosen_NK, weights_NK)
            for e, expert in enumerate(self.experts):
                out_ND = out_ND + expert(x_ND) * dense_NE[:, e, None]
        else:
            for e, expert in enumerate(self.experts):
                rows, slots = (chosen_NK == e).nonzero(as_tuple=True)
                if rows.numel():
                    out_ND = out_ND.index_add(0, rows, expert(x_ND[rows]) * weights_NK[rows, slots, None])
        out_ND = out_ND.to(x_ND.dtype)
        if self.shared_experts is not None:
            out_ND = out_ND + self.shared_experts(x_ND)
        return out_ND.view_as(x_BSD)
