"""A right-padded batch of token rows, sharded over the context-parallel group with global positions.

Every training stage scores next tokens the same way: row ``ids`` of length ``L`` gives inputs
``ids[:-1]`` and targets ``ids[1:]``. The batch is right-padded to the longest row (padding comes after
every real token, so causality keeps it invisible), then each CP rank takes its columns of the
``SeqLayout`` with their *global* positions; the columns the layout adds to make the shards even have
position -1 (padding). Per-token results land in a ``[B, W]`` grid of global columns, so a loss or a
metric never depends on the layout.

``next_token_logprobs`` runs the (parallelized) model over one rank's shard and returns the log-probs
of the targets, computed in chunks over the tokens so no ``[B, S, V]`` fp32 tensor is ever held.

Letter legend: B rows, W global input columns, S local columns, D hidden_size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringzero.model.logprobs import chunked_token_logprobs
from ringzero.parallel.runtime import Runtime
from ringzero.parallel.sharding import SeqLayout

LOGPROB_CHUNK_TOKENS = 4096
"""Tokens per LM-head chunk: 4096 x 157k vocab x 4 bytes = 2.6 GB at Ling's vocabulary."""


@dataclass
class TokenShard:
    inputs_BS: torch.Tensor  # long, this rank's columns of the inputs
    targets_BS: torch.Tensor  # long, the next token of each input column
    positions_BS: torch.Tensor  # long, global positions; -1 for layout padding
    columns_S: torch.Tensor  # long, global column of each local column (>= width for layout padding)
    width: int  # W: global input columns
    columns: list[int]  # columns_S as ints: index arithmetic stays on the host, never reads the device

    @property
    def valid_S(self) -> torch.Tensor:
        return self.columns_S < self.width

    def local_index(self, first_column: int = 0) -> list[int]:
        """Local columns at or after ``first_column`` that hold real tokens."""
        return [j for j, c in enumerate(self.columns) if first_column <= c < self.width]

    def to_grid(self, values_BS: torch.Tensor) -> torch.Tensor:
        """``[B, W]`` with this rank's values in its columns and zeros elsewhere (summed over ranks:
        the whole grid)."""
        local = self.local_index()
        dev = values_BS.device
        at = torch.tensor(local, dtype=torch.long, device=dev)
        cols = torch.tensor([self.columns[j] for j in local], dtype=torch.long, device=dev)
        grid = values_BS.new_zeros((values_BS.shape[0], self.width))
        return grid.index_copy(1, cols, values_BS.index_select(1, at))


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, device) -> torch.Tensor:
    """Right-padded ``[B, L]`` ids, uploaded once."""
    width = max(len(r) for r in rows)
    return torch.tensor(
        [list(r) + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long, device=device
    )


def shard_tokens(ids_BL: torch.Tensor, runtime: Runtime, sharding: str = "contiguous") -> TokenShard:
    """This rank's CP shard of ``ids_BL`` (rows of ``L`` tokens: ``L - 1`` input columns)."""
    inputs, targets = ids_BL[:, :-1], ids_BL[:, 1:]
    width = inputs.shape[1]
    cp, me = runtime.dims.cp, runtime.cp_rank
    layout = SeqLayout(width, cp, sharding)
    columns = layout.position_list(me)
    dev = ids_BL.device
    positions = torch.tensor([c if c < width else -1 for c in columns], dtype=torch.long, device=dev)
    return TokenShard(
        inputs_BS=layout.shard(inputs, me, dim=1, pad_value=0),
        targets_BS=layout.shard(targets, me, dim=1, pad_value=0),
        positions_BS=positions[None].expand(ids_BL.shape[0], -1),
        columns_S=torch.tensor(columns, dtype=torch.long, device=dev),
        width=width,
        columns=columns,
    )


def next_token_logprobs(
    model, shard: TokenShard, temperature: float = 1.0, *, first_column: int = 0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(target)`` ``[B, S]`` (and the entropy, without gradient) for the local columns at or after
    ``first_column`` (zeros before it and on layout padding): the LM head never runs on columns no loss
    reads, such as the prompt before the earliest response."""
    return logprobs_from_hidden(
        model,
        shard,
        model.hidden(shard.inputs_BS, shard.positions_BS),
        temperature,
        first_column=first_column,
        with_entropy=with_entropy,
    )


def logprobs_from_hidden(
    model,
    shard: TokenShard,
    hidden_BSD: torch.Tensor,
    temperature: float = 1.0,
    *,
    first_column: int = 0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``next_token_logprobs`` from the model's final hidden states of ``shard`` (the head half: what a
    micro-batch's head runs, on the last pipeline stage under pipeline parallelism)."""
    local = shard.local_index(first_column)
    B, S = shard.inputs_BS.shape
    out_dtype = torch.float64 if hidden_BSD.dtype == torch.float64 else torch.float32
    logp_BS = hidden_BSD.new_zeros((B, S), dtype=out_dtype)
    entropy_BS = torch.zeros_like(logp_BS) if with_entropy else None
    if not local:
        # Keep the graph connected: every CP rank must run the backward its peers' collectives wait in.
        return logp_BS + 0.0 * hidden_BSD.sum(), entropy_BS
    scored = torch.tensor(local, dtype=torch.long, device=hidden_BSD.device)
    logp, ent = chunked_token_logprobs(
        model.logits,
        hidden_BSD.index_select(1, scored),
        shard.targets_BS.index_select(1, scored),
        temperature,
        chunk_tokens=LOGPROB_CHUNK_TOKENS,
        with_entropy=with_entropy,
    )
    logp_BS = logp_BS.index_copy(1, scored, logp.to(out_dtype))
    if with_entropy:
        entropy_BS = entropy_BS.index_copy(1, scored, ent.to(out_dtype))
    return logp_BS, entropy_BS
