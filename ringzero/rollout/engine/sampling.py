"""Next-token sampling for a batch of rows that each carry their own settings and random stream.

Per row: temperature (0 = greedy), top-k, top-p and a ``torch.Generator``. Everything is vectorised over
rows; the only per-row Python work is refilling each row's block of uniforms every ``UNIFORM_BLOCK``
steps, so a row's draws depend on its own seed and nothing else (not on which rows share the batch).

Everything lives on the device of the logits: settings tensors, generators and uniforms. The host keeps
only the per-row flags that pick a branch (greedy, filtered), copied from the request settings when the
rows are built, so ``sample_next`` never reads the device. A generator on a CUDA device draws a
different stream than a CPU one seeded alike: seeded rows are reproducible on one device type, and
independent of their batch neighbours on every device.

The log-prob reported for a sampled token follows SGLang: ``log_softmax(logits / T)`` over the whole
vocabulary, taken *before* top-k/top-p; greedy rows report the plain ``log_softmax(logits)``. Sampling
itself draws from the top-k/top-p filtered, renormalised distribution by inverse CDF with one uniform.

Letter legend: B rows, V vocab, K uniforms per refill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

UNIFORM_BLOCK = 64
"""Uniforms drawn per row at once: one generator call per row every 64 steps instead of every step."""

_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio): neighbouring seeds land far apart


def sample_seed(request_seed: int, sample_index: int) -> int:
    """The generator seed of sample ``sample_index`` of a request seeded ``request_seed``."""
    return (request_seed * _SEED_MIX + sample_index) % (1 << 63)


def _take(values: Sequence, rows: Sequence[int]) -> tuple:
    return tuple(values[i] for i in rows)


@dataclass
class RowSettings:
    """Per-row sampling settings as device tensors ``[B]`` plus the host flags that pick a branch.

    ``select`` keeps (or repeats) rows like the cache; it takes the rows both as host indices (for the
    flags) and as the same indices on the device (for the tensors), so it reads nothing back.
    """

    temperature_B: torch.Tensor  # float64; 0 = greedy
    top_k_B: torch.Tensor  # long; <= 0 = off
    top_p_B: torch.Tensor  # float64
    filters_B: torch.Tensor  # bool: the row's settings filter the distribution (top-k or top-p)
    greedy: tuple[bool, ...]  # host copies of ``temperature_B == 0`` and ``filters_B``
    filters: tuple[bool, ...]

    @classmethod
    def build(
        cls,
        temperatures: Sequence[float],
        top_ks: Sequence[int],
        top_ps: Sequence[float],
        device: torch.device | str | None = None,
    ) -> RowSettings:
        temperatures, top_ks, top_ps = list(temperatures), list(top_ks), list(top_ps)
        filters = tuple(k > 0 or p < 1 for k, p in zip(top_ks, top_ps, strict=True))
        return cls(
            torch.tensor(temperatures, dtype=torch.float64, device=device),
            torch.tensor(top_ks, dtype=torch.long, device=device),
            torch.tensor(top_ps, dtype=torch.float64, device=device),
            torch.tensor(filters, dtype=torch.bool, device=device),
            tuple(t == 0 for t in temperatures),
            filters,
        )

    @property
    def device(self) -> torch.device:
        return self.temperature_B.device

    def select(self, rows: Sequence[int], rows_B: torch.Tensor) -> RowSettings:
        """Rows ``rows`` (host indices, possibly repeated) in order; ``rows_B`` holds them on the device."""
        return RowSettings(
            self.temperature_B[rows_B],
            self.top_k_B[rows_B],
            self.top_p_B[rows_B],
            self.filters_B[rows_B],
            _take(self.greedy, rows),
            _take(self.filters, rows),
        )

    def cat(self, other: RowSettings) -> RowSettings:
        """These rows, then ``other``'s (rows joining a running batch)."""
        return RowSettings(
            *(torch.cat([a, b]) for a, b in zip(self.tensors, other.tensors, strict=True)),
            self.greedy + other.greedy,
            self.filters + other.filters,
        )

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.temperature_B, self.top_k_B, self.top_p_B, self.filters_B

    @property
    def any_filter(self) -> bool:
        return any(self.filters)


class UniformStream:
    """Per-row uniforms in blocks: ``next()`` returns ``[B]``, one fresh value per row and call.

    One generator per row, created on ``device`` (the device the uniforms are used on) and seeded with
    the row's seed. Each row keeps its own place in its block, so a row that ``join``s mid-stream draws
    exactly what it would draw alone; rows that start together refill together, every ``UNIFORM_BLOCK`` steps.
    """

    def __init__(self, seeds: Sequence[int], device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.generators: list[torch.Generator] = []
        self._block_BK = torch.empty((0, UNIFORM_BLOCK), dtype=torch.float64, device=self.device)
        self._used: list[int] = []  # per row, uniforms taken from its block (host copy of _used_B)
        self._used_B = torch.empty(0, dtype=torch.long, device=self.device)
        self._until_refill = 0  # steps before some row exhausts its block: the host scans only then
        self.join(seeds)

    def join(self, seeds: Sequence[int]) -> None:
        """Rows with these seeds, appended after the current ones; their first ``next()`` starts their
        stream."""
        self.generators += [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]
        self._block_BK = torch.cat([self._block_BK, self._block_BK.new_zeros((len(seeds), UNIFORM_BLOCK))])
        self._used += [UNIFORM_BLOCK] * len(seeds)
        self._used_B = torch.cat([self._used_B, self._used_B.new_full((len(seeds),), UNIFORM_BLOCK)])
        self._until_refill = 0 if seeds else self._until_refill

    def next(self) -> torch.Tensor:
        if self._until_refill == 0:
            self._refill()
        self._until_refill -= 1
        u_B = self._block_BK.gather(1, self._used_B[:, None])[:, 0]
        self._used_B += 1
        self._used = [u + 1 for u in self._used]
        return u_B

    def _refill(self) -> None:
        stale = [b for b, used in enumerate(self._used) if used == UNIFORM_BLOCK]
        if stale:
            stale_B = torch.tensor(stale, dtype=torch.long, device=self.device)
            self._block_BK[stale_B] = torch.stack(
                [
                    torch.rand(
                        UNIFORM_BLOCK, generator=self.generators[b], dtype=torch.float64, device=self.device
                    )
                    for b in stale
                ]
            )
            self._used_B[stale_B] = 0
            for b in stale:
                self._used[b] = 0
        self._until_refill = UNIFORM_BLOCK - max(self._used, default=0)

    def select(self, rows: Sequence[int], rows_B: torch.Tensor) -> None:
        """Follow a row selection (dropped or repeated rows) made on the cache: host and device indices."""
        self.generators = [self.generators[i] for i in rows]
        self._block_BK = self._block_BK[rows_B]
        self._used = [self._used[i] for i in rows]
        self._used_B = self._used_B[rows_B]


def scaled_logprobs(logits_BV: torch.Tensor, temperature_B: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` per row in at least fp32; greedy rows (T = 0) use T = 1."""
    compute = torch.promote_types(logits_BV.dtype, torch.float32)
    # FP32 island: the reported log-prob is the importance ratio's denominator; never take it in bf16.
    t_B1 = torch.where(temperature_B > 0, temperature_B, 1.0).to(compute)[:, None]
    return torch.log_softmax(logits_BV.to(compute) / t_B1, dim=-1)


def filter_mask(probs_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor):
    """``(sorted_probs_BV, order_BV)`` with tokens outside top-k / top-p zeroed (SGLang's rule).

    Top-p keeps the smallest prefix of the sorted distribution whose mass reaches ``top_p`` (the token
    that crosses it stays); both cut-offs use the unfiltered probabilities, so the kept set is the
    intersection of the top-k and top-p sets.
    """
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True)
    mass_before_BV = sorted_BV.cumsum(dim=-1) - sorted_BV
    rank_V = torch.arange(probs_BV.shape[-1], device=probs_BV.device)
    k_B1 = torch.where(top_k_B > 0, top_k_B, probs_BV.shape[-1])[:, None]
    drop_BV = (rank_V[None] >= k_B1) | (mass_before_BV > top_p_B.to(probs_BV.dtype)[:, None])
    return sorted_BV.masked_fill(drop_BV, 0.0), order_BV


def inverse_cdf(probs_BV: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """Index ``i`` per row with ``cdf[i-1] <= u * total < cdf[i]`` over unnormalised ``probs``."""
    cdf_BV = probs_BV.cumsum(dim=-1)
    target_B1 = (u_B.to(cdf_BV.dtype) * cdf_BV[:, -1])[:, None]
    idx_B = (cdf_BV <= target_B1).sum(dim=-1)
    # u * total can round up to total; and a zero-probability tail must never be chosen.
    last_kept_B = (probs_BV > 0).cumsum(-1).argmax(-1)
    return torch.minimum(idx_B, last_kept_B)


def _sample(logp_BV: torch.Tensor, rows: RowSettings, u_B: torch.Tensor) -> torch.Tensor:
    # Branches follow the host flags: reading ``greedy_B`` back would cost a device sync per step.
    if all(rows.greedy):
        return logp_BV.argmax(dim=-1)
    probs_BV = logp_BV.exp()
    tokens_B = inverse_cdf(probs_BV, u_B)
    if rows.any_filter:
        # Chosen per row, never per batch: a row's tokens must not depend on its batch neighbours'
        # settings (the sorted and the vocab-order inverse CDF map one uniform to different tokens).
        kept_BV, order_BV = filter_mask(probs_BV, rows.top_k_B, rows.top_p_B)
        filtered_B = order_BV.gather(-1, inverse_cdf(kept_BV, u_B)[:, None])[:, 0]
        tokens_B = torch.where(rows.filters_B, filtered_B, tokens_B)
    if any(rows.greedy):
        tokens_B = torch.where(rows.temperature_B == 0, logp_BV.argmax(dim=-1), tokens_B)
    return tokens_B


def sample_next(logits_BV: torch.Tensor, rows: RowSettings, u_B: torch.Tensor):
    """``(token_ids [B], logprobs [B])``: sampled (or greedy) tokens and their pre-filter log-probs."""
    logp_BV = scaled_logprobs(logits_BV, rows.temperature_B)
    tokens_B = _sample(logp_BV, rows, u_B)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None])[:, 0]


def sample_from_logprobs(logp_BV: torch.Tensor, rows: RowSettings, u_B: torch.Tensor):
    """``sample_next`` on a distribution computed elsewhere: ``logp_BV`` is already ``log_softmax(logits /
    T)`` (greedy rows: T = 1), and the token is drawn from it and reported with its own entry, bit for bit."""
    tokens_B = _sample(logp_BV, rows, u_B)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None])[:, 0]


def sample_next_with_top(logits_BV: torch.Tensor, rows: RowSettings, u_B: torch.Tensor, k: int):
    """``sample_next`` plus ``(values [B, k], ids [B, k])``: the k most likely tokens of the same
    distribution.

    Top-k alternatives are taken from the reported distribution (``log_softmax(logits / T)`` before
    top-k/top-p), as SGLang reports ``output_top_logprobs``; the draws are those of ``sample_next``.
    """
    logp_BV = scaled_logprobs(logits_BV, rows.temperature_B)
    tokens_B = _sample(logp_BV, rows, u_B)
    values_Bk, ids_Bk = logp_BV.topk(min(k, logp_BV.shape[-1]), dim=-1)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None])[:, 0], (values_Bk, ids_Bk)
