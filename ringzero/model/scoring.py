"""Teacher-forced log-probs of sampled responses: the one function behind the importance ratio's numerator.

``score_sequences`` runs the training path, the parallel forward over whole sequences, and returns each
response token's ``log_softmax(logits / T)`` (SGLang's convention, before top-p/top-k). The RL trainer
calls it for ``logp_train`` (with gradients; wrap it in ``torch.no_grad()`` to only measure).

Deterministic mode, and why the ratio is then exactly 1
-------------------------------------------------------
A float result depends on the dtype, the order of operations and, in batched kernels, on the shapes
involved (padding width, sequence length, the number of rows a matmul blocks over). Cached decoding and
the parallel forward differ in all three, so their log-probs differ in the last bits, and exponentiation
turns that into the ratio's tail. Deterministic mode removes every difference instead of shrinking it:

- one forward, one shape: with ``batch_invariant=True`` each sequence runs alone through
  ``bitwise_hidden``, right-padded to the model's whole context (``max_position_embeddings`` columns).
  Every matmul, attention and LM-head call then has one shape whatever the sequence, its length or its
  batch neighbours, and causality keeps the padding (and any later token) out of an earlier column by
  exact zeros, so the logits at column ``c`` depend only on tokens ``0..c`` and the weights. (Measured on
  the CPU kernels: at the sequence's own length, without the fixed width, a prefix and its extension
  disagree in the last bits at most columns; at the fixed width they agree bitwise.)
- the rollout engine in deterministic mode decodes *through this forward*: at each step it runs
  ``bitwise_hidden`` on the sequence so far and samples from ``bitwise_next_logprobs``, the same LM-head
  chunk and log-softmax ``chunked_token_logprobs`` computes here, so the distribution it samples from is
  the one whose log-prob it reports and the one the trainer computes later
  (``ringzero.rollout.engine.bitwise``);
- same dtype: the engine's policy must equal the trainer's, so both hold bitwise-equal weight tensors
  (``ringzero.rollout.engine.gap`` refuses a deterministic pair of different policies).

Then ``logp_train - logp_rollout`` is 0.0 for every token. The cost: a full-context forward per scored
sequence on the trainer side, and one per sampled token on the rollout side. MoE models are not covered:
the expert loop (``ringzero.model.moe``) runs each expert on the tokens routed to it, a row count that
depends on the other tokens, so MoE layers agree to rounding, not bitwise. The guarantee holds within one
build of torch running the same kernels with the same thread count; across machines use identical
builds and settings.

The LM head runs through ``chunked_token_logprobs`` (``ringzero.model.logprobs``): at most
``chunk_tokens`` positions' logits exist at once, and with gradients each chunk is recomputed in
backward instead of kept, so long sequences at a real vocabulary fit.

Letter legend: N sequences, T columns, V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringzero.errors import RingzeroError
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import DEFAULT_CHUNK_TOKENS, chunked_token_logprobs, scaled_log_softmax
from ringzero.model.moe import fixed_shape_experts
from ringzero.model.precision import at_least_fp32

DEFAULT_MICRO_BATCH = 16
# Positions per LM-head chunk when scoring: [chunk, V] logits exist at once (4096 x 157k fp32 = 2.6 GB).
SCORE_CHUNK_TOKENS = DEFAULT_CHUNK_TOKENS


def _check(sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int]) -> None:
    if len(sequences) != len(prompt_lens):
        raise RingzeroError(f"{len(sequences)} sequences but {len(prompt_lens)} prompt lengths")
    for i, (seq, plen) in enumerate(zip(sequences, prompt_lens, strict=True)):
        if not 1 <= plen <= len(seq):
            raise RingzeroError(f"sequence {i}: prompt length {plen} outside 1..{len(seq)} (its length)")


@dataclass
class Scored:
    """One sequence's scored tokens: their log-probs ``[n]`` and, when asked, the top-k ``[n, K]`` and the
    entropy ``[n]`` (no gradient) of each position's distribution."""

    logprobs: torch.Tensor
    top_values: torch.Tensor | None = None  # the K largest log-probs per position, most likely first
    top_ids: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


def _top_logprobs(head, hidden_NSD: torch.Tensor, temperature: float, k: int, chunk_tokens: int):
    """``(values [N, S, k'], ids [N, S, k'])`` of ``log_softmax(head(hidden) / T)``, k' = min(k, V).

    Chunks and per-position arithmetic are ``chunked_token_logprobs``'s own (the head on the same
    slices, fp32 logits, / T, log-softmax), so a scored token among the top k carries the same value.
    """
    N, S, D = hidden_NSD.shape
    chunks = (
        [hidden_NSD]
        if N * S <= chunk_tokens
        else [
            hidden_NSD.reshape(1, N * S, D)[:, start : start + chunk_tokens]
            for start in range(0, N * S, chunk_tokens)
        ]
    )
    values, ids = [], []
    for h in chunks:
        logits = head(h)
        logp = torch.log_softmax(logits.to(at_least_fp32(logits.dtype)) / temperature, dim=-1)
        v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
        values.append(v.reshape(1, -1, v.shape[-1]))
        ids.append(i.reshape(1, -1, i.shape[-1]))
    width = values[0].shape[-1]
    return torch.cat(values, 1).view(N, S, width), torch.cat(ids, 1).view(N, S, width)


def _score_padded(
    model: HybridLM,
    batch: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    temperature: float,
    pad_id: int,
    top_k: int = 0,
    with_entropy: bool = False,
) -> list[Scored]:
    """Right-padded batch: padding sits after every real token, so causality keeps it invisible."""
    device = next(model.parameters()).device
    width = max(len(s) for s in batch)
    ids_NT = torch.full((len(batch), width), pad_id, dtype=torch.long, device=device)
    for row, seq in enumerate(batch):
        ids_NT[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
    # Logits of the last column predict nothing; the LM head only runs on the columns that score.
    first = min(prompt_lens) - 1
    hidden_NTD = model.hidden(ids_NT[:, :-1])[:, first:]
    # The LM head and log-softmax run over chunks of positions: never the whole [N, T, V] in fp32.
    logp_NT, ent_NT = chunked_token_logprobs(
        model.logits,
        hidden_NTD,
        ids_NT[:, first + 1 :],
        temperature,
        chunk_tokens=SCORE_CHUNK_TOKENS,
        with_entropy=with_entropy,
    )
    top = (
        _top_logprobs(model.logits, hidden_NTD, temperature, top_k, SCORE_CHUNK_TOKENS) if top_k > 0 else None
    )
    return [
        _scored(logp_NT, top, ent_NT, row, slice(plen - 1 - first, len(seq) - 1 - first))
        for row, (seq, plen) in enumerate(zip(batch, prompt_lens, strict=True))
    ]


def _scored(
    logp_NT: torch.Tensor, top: tuple | None, ent_NT: torch.Tensor | None, row: int, cols: slice
) -> Scored:
    """Row ``row``'s scored columns ``cols`` of the grids one forward filled."""
    return Scored(
        logp_NT[row, cols],
        *((top[0][row, cols], top[1][row, cols]) if top else (None, None)),
        None if ent_NT is None else ent_NT[row, cols],
    )


def bitwise_ids(model: HybridLM, sequence: Sequence[int], pad_id: int = 0) -> torch.Tensor:
    """``[1, W]``: ``sequence`` right-padded with ``pad_id`` to the model's context, ``W =
    max_position_embeddings``."""
    device = next(model.parameters()).device
    width = model.cfg.max_position_embeddings
    if len(sequence) > width:
        raise RingzeroError(f"a sequence of {len(sequence)} tokens exceeds max_position_embeddings {width}")
    return torch.tensor(
        [list(sequence) + [pad_id] * (width - len(sequence))], dtype=torch.long, device=device
    )


def bitwise_hidden(model: HybridLM, ids_1W: torch.Tensor) -> torch.Tensor:
    """The batch-invariant forward: residual stream ``[1, W, D]`` of one sequence at the fixed width."""
    if ids_1W.shape != (1, model.cfg.max_position_embeddings):
        raise RingzeroError(
            f"the batch-invariant forward takes [1, {model.cfg.max_position_embeddings}] ids, "
            f"got {list(ids_1W.shape)}"
        )
    with fixed_shape_experts():  # MoE: every expert on every token, so no token's bits depend on another's
        return model.hidden(ids_1W)


def _head_chunk(width: int, column: int, chunk_tokens: int) -> slice:
    """The columns ``chunked_token_logprobs`` (one row of ``width`` positions) runs the LM head on with
    ``column``."""
    if width <= chunk_tokens:
        return slice(0, width)
    start = column // chunk_tokens * chunk_tokens
    return slice(start, start + chunk_tokens)


def bitwise_next_logprobs(
    model: HybridLM,
    hidden_1WD: torch.Tensor,
    column: int,
    temperature: float,
    chunk_tokens: int = SCORE_CHUNK_TOKENS,
) -> torch.Tensor:
    """``log_softmax(logits / T)`` ``[V]`` at ``column`` of ``bitwise_hidden``'s output: the distribution of
    the token at ``column + 1``, computed as the trainer's scoring computes it (same LM-head chunk, same op
    order)."""
    cols = _head_chunk(hidden_1WD.shape[1], column, chunk_tokens)
    logp_1CV = scaled_log_softmax(model.logits(hidden_1WD[:, cols]), temperature)
    return logp_1CV[0, column - cols.start]


def _score_bitwise(
    model: HybridLM,
    sequence: Sequence[int],
    prompt_len: int,
    temperature: float,
    pad_id: int,
    top_k: int,
    with_entropy: bool = False,
) -> Scored:
    """One sequence through ``bitwise_hidden``; the LM head on every column (fixed shapes, see the module)."""
    ids_1W = bitwise_ids(model, sequence, pad_id)
    hidden_1WD = bitwise_hidden(model, ids_1W)
    targets_1W = torch.cat((ids_1W[:, 1:], ids_1W[:, :1]), dim=1)  # the last column predicts nothing
    logp_1W, ent_1W = chunked_token_logprobs(
        model.logits,
        hidden_1WD,
        targets_1W,
        temperature,
        chunk_tokens=SCORE_CHUNK_TOKENS,
        with_entropy=with_entropy,
    )
    top = (
        _top_logprobs(model.logits, hidden_1WD, temperature, top_k, SCORE_CHUNK_TOKENS) if top_k > 0 else None
    )
    return _scored(logp_1W, top, ent_1W, 0, slice(prompt_len - 1, len(sequence) - 1))


def score_tokens(
    model: HybridLM,
    sequences: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    temperature: float = 1.0,
    batch_invariant: bool = False,
    *,
    top_k: int = 0,
    pad_id: int = 0,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    with_entropy: bool = False,
) -> list[Scored]:
    """``score_sequences``, with the ``top_k`` most likely tokens of each scored position when ``top_k > 0``
    and each position's entropy (from the same logits) with ``with_entropy``."""
    _check(sequences, prompt_lens)
    if top_k < 0:
        raise RingzeroError(f"top_k must be >= 0 (got {top_k})")
    t = temperature if temperature > 0 else 1.0
    if batch_invariant:
        return [
            _score_bitwise(model, seq, plen, t, pad_id, top_k, with_entropy)
            for seq, plen in zip(sequences, prompt_lens, strict=True)
        ]
    step = max(1, micro_batch)
    out: list[Scored] = []
    for start in range(0, len(sequences), step):
        out += _score_padded(
            model,
            sequences[start : start + step],
            prompt_lens[start : start + step],
            t,
            pad_id,
            top_k,
            with_entropy,
        )
    return out


def score_sequences(
    model: HybridLM,
    sequences: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    temperature: float = 1.0,
    batch_invariant: bool = False,
    *,
    pad_id: int = 0,
    micro_batch: int = DEFAULT_MICRO_BATCH,
) -> list[torch.Tensor]:
    """Per sequence, the log-probs ``[len - prompt_len]`` of its response tokens under ``model``.

    ``sequences[i]`` is prompt + response; ``prompt_lens[i]`` its prompt length (>= 1). ``temperature``
    0 means greedy decoding, whose log-probs are the plain log-softmax (T = 1). Output dtype is fp32
    (fp64 under an fp64 body). ``batch_invariant`` scores each sequence alone at the model's full context
    width (see the module docstring); otherwise sequences run right-padded in micro-batches of
    ``micro_batch``.
    """
    return [
        s.logprobs
        for s in score_tokens(
            model,
            sequences,
            prompt_lens,
            temperature,
            batch_invariant,
            pad_id=pad_id,
            micro_batch=micro_batch,
        )
    ]
