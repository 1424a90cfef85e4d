"""Teacher-forced log-probs of sampled responses: the one function behind the importance ratio's numerator.

``score_sequences`` runs the training path, the parallel forward over whole sequences, and returns each
response token's ``log_softmax(logits / T)`` (SGLang's convention, before top-p/top-k). The RL trainer
calls it for ``logp_train`` (with gradients; wrap it in ``torch.no_grad()`` to only measure).

Deterministic mode, and why the ratio is then exactly 1
-------------------------------------------------------
A float result depends on the dtype, the order of operations and, in batched kernels, on what else
is in the batch (padding width, the number of rows a matmul blocks over). Cached decoding and the
parallel forward differ in all three, so their log-probs differ in the last bits, and exponentiation
turns that into the ratio's tail. Deterministic mode removes every difference instead of shrinking it:

- one function: the rollout engine in deterministic mode does not report its decoding log-probs; when
  a sequence finishes it rescores it with ``score_sequences`` on its own weights, the same path the
  trainer runs (same code, same op order);
- same dtype: the engine's policy must equal the trainer's, so both hold bitwise-equal weight tensors
  (``ringzero.rollout.gap`` refuses a deterministic pair of different policies);
- batch-invariant: with ``batch_invariant=True`` each sequence runs alone, unpadded, as a batch of one,
  so its log-probs depend only on its tokens and the weights, not on which sequences share the batch,
  how they are ordered or how long the others are. The trainer passes ``batch_invariant=True`` too.

Then ``logp_train - logp_rollout`` is 0.0 for every token. The cost is a second forward per sequence
on the rollout side and unbatched scoring on both sides. The guarantee holds within one build of torch
running the same CPU kernels with the same thread count (a different count may pick a different
reduction split); across machines use identical builds and settings.

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
from ringzero.model.logprobs import DEFAULT_CHUNK_TOKENS, chunked_token_logprobs
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
    """One sequence's scored tokens: their log-probs ``[n]`` and, when asked, the top-k ``[n, K]``."""

    logprobs: torch.Tensor
    top_values: torch.Tensor | None = None  # the K largest log-probs per position, most likely first
    top_ids: torch.Tensor | None = None


def _top_logprobs(head, hidden_NSD: torch.Tensor, temperature: float, k: int, chunk_tokens: int):
    """``(values [N, S, k'], ids [N, S, k'])`` of ``log_softmax(head(hidden) / T)``, k' = min(k, V).

    Chunks and per-position arithmetic are ``chunked_token_logprobs``'s own (the head on the same
    slices, fp32 logits, / T, log-softmax), so a scored token among the top k carries the same value.
    """
    N, S, D = hidden_NSD.shape
    chunks = [hidden_NSD] if N * S <= chunk_tokens else [
        hidden_NSD.reshape(1, N * S, D)[:, start:start + chunk_tokens] for start in range(0, N * S, chunk_tokens)]
    values, ids = [], []
    for h in chunks:
        logits = head(h)
        logp = torch.log_softmax(logits.to(at_least_fp32(logits.dtype)) / temperature, dim=-1)
        v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
        values.append(v.reshape(1, -1, v.shape[-1]))
        ids.append(i.reshape(1, -1, i.shape[-1]))
    width = values[0].shape[-1]
    return torch.cat(values, 1).view(N, S, width), torch.cat(ids, 1).view(N, S, width)


def _score_padded(model: HybridLM, batch: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                  temperature: float, pad_id: int, top_k: int = 0) -> list[Scored]:
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
    logp_NT, _ = chunked_token_logprobs(model.logits, hidden_NTD, ids_NT[:, first + 1:], temperature,
                                        chunk_tokens=SCORE_CHUNK_TOKENS)
    top = _top_logprobs(model.logits, hidden_NTD, temperature, top_k, SCORE_CHUNK_TOKENS) if top_k > 0 else None
    out = []
    for row, (seq, plen) in enumerate(zip(batch, prompt_lens, strict=True)):
        cols = slice(plen - 1 - first, len(seq) - 1 - first)
        out.append(Scored(logp_NT[row, cols], *((top[0][row, cols], top[1][row, cols]) if top else ())))
    return out


def score_tokens(model: HybridLM, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                 temperature: float = 1.0, batch_invariant: bool = False, *, top_k: int = 0, pad_id: int = 0,
                 micro_batch: int = DEFAULT_MICRO_BATCH) -> list[Scored]:
    """``score_sequences``, with the ``top_k`` most likely tokens of each scored position when ``top_k > 0``."""
    _check(sequences, prompt_lens)
    if top_k < 0:
        raise RingzeroError(f"top_k must be >= 0 (got {top_k})")
    t = temperature if temperature > 0 else 1.0
    step = 1 if batch_invariant else max(1, micro_batch)
    out: list[Scored] = []
    for start in range(0, len(sequences), step):
        out += _score_padded(model, sequences[start:start + step], prompt_lens[start:start + step], t, pad_id,
                             top_k)
    return out


def score_sequences(model: HybridLM, sequences: Sequence[Sequence[int]], prompt_lens: Sequence[int],
                    temperature: float = 1.0, batch_invariant: bool = False, *, pad_id: int = 0,
                    micro_batch: int = DEFAULT_MICRO_BATCH) -> list[torch.Tensor]:
    """Per sequence, the log-probs ``[len - prompt_len]`` of its response tokens under ``model``.

    ``sequences[i]`` is prompt + response; ``prompt_lens[i]`` its prompt length (>= 1). ``temperature``
    0 means greedy decoding, whose log-probs are the plain log-softmax (T = 1). Output dtype is fp32
    (fp64 under an fp64 body). ``batch_invariant`` scores each sequence alone (see the module docstring);
    otherwise sequences run right-padded in micro-batches of ``micro_batch``.
    """
    return [s.logprobs for s in score_tokens(model, sequences, prompt_lens, temperature, batch_invariant,
                                             pad_id=pad_id, micro_batch=micro_batch)]
