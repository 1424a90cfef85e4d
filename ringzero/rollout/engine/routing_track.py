"""The experts the engine's forwards chose, per row: ``Completion.routed_experts``
(``return_routed_experts``).

The layout is SGLang's: int32 ``[len(prompt) + len(output) - 1, num_hidden_layers, num_experts_per_tok]``,
row ``p`` the experts token ``p`` went to when it was fed (every prompt token, then every sampled token but
the last, which no forward sees), ``-1`` on dense layers. (SGLang: ``BaseTopkCapturer.get_topk`` in
``python/sglang/srt/state_capturer/base.py`` returns the rows ``[0, seqlen - 1)``.)

How one decoding group is tracked (``GroupRouting``), everything on the engine's device:

* prefill: ``capture_routing`` around the (possibly chunked) prefill of the group's distinct prompts gives
  ``[P, width, K]`` per MoE layer over the left-padded columns; each prompt keeps its last ``len(prompt)``
  columns, its real tokens;
* fan-out to the ``n`` rows of a prompt: a row reads its prompt's part, nothing is copied;
* decoding: each step's forward gives ``[B, 1, K]`` for the live rows; the step keeps it with the original
  row of each live row (``select`` follows the ``keep_B`` the cache is given);
* ``rows`` sorts the steps' records by row (stable: in step order) and puts them after the prompt's.

``to_host`` widens the MoE layers to all layers (``-1`` on dense ones) and brings every row of a call back in
one copy. The steps' records cost ``M * K`` int32 per fed token, only while the group decodes.

Letter legend: P prompts, B live rows, N fed tokens, L layers, M MoE layers, K experts per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ringzero.model.routing import capture_routing, moe_layers


def routing_shape(model) -> tuple[int, int] | None:
    """``(num_hidden_layers, num_experts_per_tok)`` of a model with MoE layers; None for a dense one."""
    if not moe_layers(model):
        return None
    return model.cfg.num_hidden_layers, model.cfg.num_experts_per_tok


def stacked(chosen: dict[int, torch.Tensor], moe: Sequence[int]) -> torch.Tensor:
    """One capture's ``{layer: [B, S, K]}`` as int32 ``[B, S, M, K]``, MoE layers in ``moe`` order."""
    return torch.stack([chosen[i] for i in moe], dim=2).to(torch.int32)


class GroupRouting:
    """The experts of one group's prefill and decoding steps; ``enabled=False`` captures nothing."""

    def __init__(self, model, rows: int, device: torch.device, *, enabled: bool = True):
        self.enabled = enabled
        self._model = model
        self.moe = [i for i, _ in moe_layers(model)]
        self._prompts: list[torch.Tensor] = []  # per distinct prompt: [len(prompt), M, K]
        self._steps: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: (original rows [B], [B, M, K])
        self._alive_B = torch.arange(rows, device=device) if enabled else None

    @contextmanager
    def prefill(self, prompt_lens: Sequence[int]) -> Iterator[None]:
        """Wrap the prefill of left-padded prompts of these lengths (every chunk of it)."""
        if not self.enabled:
            yield
            return
        with capture_routing(self._model) as chosen:
            yield
        experts_PSMK = stacked(chosen, self.moe)
        width = experts_PSMK.shape[1]
        self._prompts = [experts_PSMK[p, width - n :] for p, n in enumerate(prompt_lens)]

    @contextmanager
    def step(self) -> Iterator[None]:
        """Wrap one decoding forward of the live rows (one token each)."""
        if not self.enabled:
            yield
            return
        with capture_routing(self._model) as chosen:
            yield
        self._steps.append((self._alive_B, stacked(chosen, self.moe)[:, 0]))

    def select(self, keep_B: torch.Tensor) -> None:
        """The live rows kept, as the index the cache is given."""
        if self.enabled:
            self._alive_B = self._alive_B[keep_B]

    def rows(self, prompt_of: Sequence[int], fed: Sequence[int]) -> list[torch.Tensor]:
        """Per row ``[len(prompt) + fed, M, K]``: its prompt's experts (``prompt_of``: which prefilled
        prompt), then those of the ``fed`` sampled tokens the decoding forwards saw (its output length -
        1)."""
        recorded = sum(b.shape[0] for b, _ in self._steps)
        if recorded != sum(fed):
            raise RuntimeError(f"routing: {recorded} decoded tokens recorded, {sum(fed)} expected")
        if self._steps:
            rows_N = torch.cat([b for b, _ in self._steps])
            experts_NMK = torch.cat([e for _, e in self._steps])[torch.argsort(rows_N, stable=True)]
            decoded = torch.split(experts_NMK, list(fed))
        else:
            decoded = [self._prompts[0][:0]] * len(fed)
        return [torch.cat((self._prompts[p], d)) for p, d in zip(prompt_of, decoded, strict=True)]


def to_host(
    parts: Sequence[torch.Tensor | None], moe: Sequence[int], num_layers: int
) -> list[torch.Tensor | None]:
    """Each ``[T, M, K]`` part as int32 ``[T, num_layers, K]`` on the host (``-1`` on dense layers), in one
    copy."""
    present = [p for p in parts if p is not None]
    if not present:
        return list(parts)
    flat_NMK = torch.cat(present)
    full_NLK = torch.full(
        (flat_NMK.shape[0], num_layers, flat_NMK.shape[-1]), -1, dtype=torch.int32, device=flat_NMK.device
    )
    full_NLK[:, list(moe)] = flat_NMK
    pieces = iter(torch.split(full_NLK.cpu(), [p.shape[0] for p in present]))
    return [None if p is None else next(pieces) for p in parts]
