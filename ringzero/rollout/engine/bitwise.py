"""Deterministic decoding: every token sampled from the trainer's own forward, so the reported log-prob is
its.

The embedded engine's ``deterministic`` mode decodes with this loop instead of the cached one. Per step and
per live row, alone (a batch of one):

1. the row's sequence so far, right-padded to the model's context, goes through ``bitwise_hidden``: the
   forward ``score_sequences(..., batch_invariant=True)`` runs for the trainer (``ringzero.model.scoring``);
2. ``bitwise_next_logprobs`` takes the last real column's ``log_softmax(logits / T)`` exactly as the
   trainer's LM-head chunk computes it;
3. the row's seeded sampler (``sample_from_logprobs``: temperature, top-k, top-p as in normal mode) draws the
   token from *that* distribution, and its entry there is the reported log-prob.

So the tokens are drawn from the distribution whose log-prob is reported, and that distribution is bitwise
the trainer's at the same position: ``logp_train - logp_rollout`` is 0.0 because the two are one computation,
not because one side was overwritten with the other. Output top-k alternatives are the top-k of the same
row; ``return_routed_experts`` gives, per fed token, the experts of the forward that fed it (the prompt's
tokens: the first step's forward; each sampled token: the next step's). Prompt log-probs come from
``score_tokens(..., batch_invariant=True)`` on the prompt, which is this first step's forward (same ids,
same shapes, same numbers).

Why not the cached decoding step: its shapes (one column, a growing cache) differ from the trainer's, and
so do its last bits. Why not the parallel forward at the sequence's own length (O(T^2)): on the CPU kernels a
prefix and its extension disagree in the last bits at most columns (a matmul's blocking follows its row
count), so it would not be the trainer's forward either. The fixed width makes every shape the same.

Cost: one full-context forward per sampled token and row (no cache, no batching across rows): about
``max_position_embeddings`` times the work of a cached step. ``bench/bitwise_cost.py`` measures it.
MoE models decode this way too, but agree with the trainer to rounding only (see ``ringzero.model.scoring``).

Letter legend: B live rows, W context width, V vocab, M MoE layers, K experts per token.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ringzero.model.routing import capture_routing, moe_layers
from ringzero.model.scoring import bitwise_hidden, bitwise_ids, bitwise_next_logprobs
from ringzero.rollout.engine.logprob_extras import TopK, TopKTrack
from ringzero.rollout.engine.routing_track import stacked
from ringzero.rollout.engine.rows import DecodingRows, Finished, RowSpec
from ringzero.rollout.engine.sampling import sample_from_logprobs
from ringzero.tokenizer.base import Tokenizer


@dataclass
class Decoded:
    """A row's outcome from ``decode``; ``capped``: an abort ended it early (at its last step's token)."""

    result: Finished
    top: list[TopK] | None
    routing: torch.Tensor | None  # [fed tokens, M, K] on the device, when the row asked
    capped: bool


def _temperature(t: float) -> float:
    return t if t > 0 else 1.0  # greedy reports the plain log-softmax, as the trainer scores it


def decode(
    model,
    rows: Sequence[RowSpec],
    aborted: Callable[[], Collection[int]],
    seen,
    tokenizer: Tokenizer | None,
    pad_id: int,
) -> list[Decoded]:
    """Decode ``rows`` token by token through the batch-invariant forward (``seen``: the abort check's last
    answer). Per step the host reads back only ``DecodingRows.advance``'s stop check."""
    device = next(model.parameters()).device
    state = DecodingRows(list(rows), tokenizer, device)
    ids_BW = torch.cat([bitwise_ids(model, r.prompt, pad_id) for r in rows])
    top_k = max(r.top_k for r in rows)
    track = TopKTrack(len(rows), state.steps, top_k, device) if top_k else None
    moe = [i for i, _ in moe_layers(model)]
    experts: list[list[torch.Tensor]] = [[] for _ in rows]
    capped: set[int] = set()
    alive = state.alive
    for t in range(state.steps):
        logps = []
        for r in alive:
            column = len(rows[r].prompt) - 1 + t
            with capture_routing(model) if rows[r].routed else nullcontext({}) as chosen:
                hidden_1WD = bitwise_hidden(model, ids_BW[r : r + 1])
            logps.append(
                bitwise_next_logprobs(model, hidden_1WD, column, _temperature(rows[r].params.temperature))
            )
            # the tokens this forward fed first: the prompt's at step 0, else the last sampled
            if rows[r].routed:
                experts_WMK = stacked(chosen, moe)[0]
                experts[r].append(experts_WMK[: column + 1] if t == 0 else experts_WMK[column : column + 1])
        logp_BV = torch.stack(logps)
        tokens_B, logp_B = sample_from_logprobs(logp_BV, state.settings, state.uniforms.next())
        if track is not None:
            track.record(t, *logp_BV.topk(min(track.k, logp_BV.shape[-1]), dim=-1))
        now = aborted()
        if now is not seen:  # the caller aborted requests: their rows end with this step's token
            seen = now
            for r in alive:
                if rows[r].request in now and r not in capped:
                    capped.add(r)
                    state.cap(r, t + 1)
        # Each live row's token goes after its sequence so far (in range: a row's cap leaves it room).
        rows_B = torch.tensor(alive, dtype=torch.long, device=device)
        cols_B = torch.tensor([len(rows[r].prompt) + t for r in alive], dtype=torch.long, device=device)
        ids_BW[rows_B, cols_B] = tokens_B
        keep_B = state.advance(t, tokens_B, logp_B)
        if keep_B is not None:  # some rows finished
            if keep_B.numel() == 0:
                break
            if track is not None:
                track.select(keep_B)
            alive = state.alive
    out = []
    for r, (f, row) in enumerate(zip(state.results(), rows, strict=True)):
        top = track.pairs(r, len(f.output_ids), row.top_k) if track is not None and row.top_k else None
        routing = None
        if row.routed:  # the last sampled token is never fed
            routing = torch.cat(experts[r])[: len(row.prompt) + len(f.output_ids) - 1]
        out.append(Decoded(f, top, routing, r in capped))
    return out


def route_prompt(model, prompt: Sequence[int], pad_id: int) -> torch.Tensor:
    """A prefill-only row's experts ``[len(prompt) - 1, M, K]``: its prompt's tokens but the last, from the
    batch-invariant forward of the prompt."""
    moe = [i for i, _ in moe_layers(model)]
    with capture_routing(model) as chosen:
        bitwise_hidden(model, bitwise_ids(model, prompt, pad_id))
    return stacked(chosen, moe)[0, : len(prompt) - 1]
