"""The training model's log-probs of sampled responses, micro-batch by micro-batch, on every layout.

``scores(model, batch, groups, T)`` returns one ``Scores`` per group of rows (call it under ``no_grad``);
``backward(..., loss_of)`` hands each micro-batch's ``Scores`` to ``loss_of(i, scores) -> (loss, record)``,
backpropagates the loss before the next micro-batch runs (no graph outlives its micro-batch) and returns
the records. Under pipeline parallelism the head runs on the last stage alone: the other stages get None.

Two ways to score, chosen by ``batch_invariant``:

- each row alone, unpadded (``model.scoring.score_tokens``): bitwise the log-probs a deterministic rollout
  engine reported (cp = 1, the config refuses the rest);
- padded micro-batches of a row split over the context-parallel ranks (``parallel.token_shards``): each rank
  scores its own tokens of each row, zeros elsewhere (``owned_mT``); ``Runtime.sum_`` brings them together.

With ``replay``, each row is rescored with the experts the rollout engine reported for it (routing replay).

Letter legend: m rows of a micro-batch, T response positions, S a shard's input columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ringzero.model.routing import moe_layers, replay_routing
from ringzero.model.scoring import score_tokens
from ringzero.parallel.micro_batches import MicroBatch, run_micro_batches
from ringzero.parallel.runtime import Runtime
from ringzero.parallel.token_shards import logprobs_from_hidden, pad_rows, shard_tokens
from ringzero.rl.rollout_batch import RolloutBatch


class Scores(NamedTuple):
    logp_mT: torch.Tensor
    owned_mT: torch.Tensor  # this rank's tokens of the rows (all of them on one rank)
    entropy_mT: torch.Tensor | None


LossOf = Callable[[int, Scores], tuple[torch.Tensor, Any]]


@dataclass(frozen=True)
class PolicyScorer:
    runtime: Runtime
    temperature: float
    pad_id: int
    sharding: str
    batch_invariant: bool

    def scores(
        self, model, batch: RolloutBatch, groups: list[list[int]], T: int, *, with_entropy=False, replay=False
    ) -> list[Scores | None]:
        """``Scores`` of each group of rows (None on pipeline stages other than the last)."""
        return self._run(model, batch, groups, T, with_entropy, loss_of=None, replay=replay)

    def backward(
        self, model, batch, groups, T: int, loss_of: LossOf, *, with_entropy=False, replay=False
    ) -> list[Any]:
        """``loss_of``'s record of each group, its loss backpropagated micro-batch by micro-batch."""
        return self._run(model, batch, groups, T, with_entropy, loss_of=loss_of, replay=replay)

    def _run(self, model, batch, groups, T, with_entropy, *, loss_of, replay) -> list[Any]:
        t = self.temperature if self.temperature > 0 else 1.0
        if self.batch_invariant:
            records = []
            for i, rows in enumerate(groups):
                sequences, prompt_lens = batch.sequences(rows)
                # The entropy comes from the logits of the same forward, never from a second one.
                scored = score_tokens(
                    model, sequences, prompt_lens, t, True, pad_id=self.pad_id, with_entropy=with_entropy
                )
                logp_mT = padded([s.logprobs for s in scored], T)
                entropy_mT = padded([s.entropy for s in scored], T) if with_entropy else None
                scores = Scores(logp_mT, torch.ones_like(logp_mT, dtype=torch.bool), entropy_mT)
                if loss_of is None:
                    records.append(scores)
                    continue
                loss, record = loss_of(i, scores)
                loss.backward()
                records.append(record)
            return records
        micro = [
            self._micro_batch(model, batch, rows, T, t, with_entropy, replay, loss_of, i)
            for i, rows in enumerate(groups)
        ]
        return run_micro_batches(model, micro, backward=loss_of is not None)

    def _micro_batch(self, model, batch, rows, T, t, with_entropy, replay, loss_of, i) -> MicroBatch:
        device = self.runtime.device
        sequences, prompt_lens = batch.sequences(rows)
        shard = shard_tokens(pad_rows(sequences, self.pad_id, device), self.runtime, self.sharding)
        plens_m = torch.tensor(prompt_lens, dtype=torch.long, device=device)
        context = None
        if replay:
            experts = replay_experts(model, [batch.routed_experts[r] for r in rows], shard)
            context = lambda: replay_routing(model, experts)  # noqa: E731

        def head(hidden_BSD):
            logp_mS, ent_mS = logprobs_from_hidden(
                model, shard, hidden_BSD, t, first_column=min(prompt_lens) - 1, with_entropy=with_entropy
            )
            scores = Scores(
                response_view(shard.to_grid(logp_mS), plens_m, T),
                response_view(shard.to_grid(torch.ones_like(logp_mS)), plens_m, T) > 0,
                None if ent_mS is None else response_view(shard.to_grid(ent_mS), plens_m, T),
            )
            return (None, scores) if loss_of is None else loss_of(i, scores)

        return MicroBatch(shard, head, context)


def padded(logps: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack per-sequence log-probs into ``[M, width]`` (zeros after each row's end), keeping gradients."""
    rows = [torch.nn.functional.pad(lp, (0, width - lp.shape[0])) for lp in logps]
    return torch.stack(rows) if rows else torch.zeros((0, width))


def response_view(grid_mW: torch.Tensor, prompt_lens_m: torch.Tensor, T: int) -> torch.Tensor:
    """``[m, T]``: response token t of row i is predicted at input column ``prompt_len_i - 1 + t``."""
    W = grid_mW.shape[1]
    col_mT = (prompt_lens_m - 1)[:, None] + torch.arange(T, device=grid_mW.device)[None, :]
    inside_mT = col_mT < W
    values = grid_mW.gather(1, col_mT.clamp(max=W - 1))
    return torch.where(inside_mT, values, torch.zeros_like(values))


def replay_experts(model, experts: list, shard) -> dict[int, torch.Tensor]:
    """Per MoE layer ``[m, S, K]``: each row's reported experts at this shard's input columns (a fed token's
    experts sit at its own index; columns past a row's end and layout padding take expert 0, which only
    padding tokens see)."""
    device = shard.inputs_BS.device
    cols = torch.tensor([min(c, shard.width) for c in shard.columns], dtype=torch.long, device=device)
    out = {}
    for layer, _ in moe_layers(model):
        rows = []
        for e in experts:
            per = torch.as_tensor(e)[:, layer].to(device=device, dtype=torch.long)  # [P + O - 1, K]
            grid = per.new_zeros((shard.width + 1, per.shape[1]))
            grid[: per.shape[0]] = per.clamp(min=0)
            rows.append(grid.index_select(0, cols))
        out[layer] = torch.stack(rows)
    return out
