"""When a row stops: a stop token id (eos included), a stop string in the decoded text, or its length cap.

The token that triggers a stop stays in ``output_ids`` (with its log-prob): the policy has to learn to
emit it, so the trainer must see it. Stop ids and length caps are checked for all rows at once with
tensors; only rows that have stop strings pay a per-step decode. Stop strings are matched on the text
of the *output* only (never the prompt), decoded from a tail window of tokens; since every step is
checked, any match found is one the newest token completed.

Letter legend: B rows, S stop ids per row (padded with -1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ringzero.errors import RingzeroError
from ringzero.tokenizer.base import Tokenizer

TOKENS_PER_CHAR_BOUND = 4
"""A character is at most 4 tokens (byte-level BPE of a 4-byte UTF-8 character): bounds the decode window."""

STOP = "stop"
LENGTH = "length"


class StopStrings:
    """Stop strings of one row, matched on a decoded tail of its output."""

    def __init__(self, strings: Sequence[str], tokenizer: Tokenizer | None):
        if strings and tokenizer is None:
            raise RingzeroError("stop strings need a tokenizer to decode the output; this engine has none")
        if any(not s for s in strings):
            raise RingzeroError("stop strings must be non-empty")
        self.strings = tuple(strings)
        self.tokenizer = tokenizer
        self.window = TOKENS_PER_CHAR_BOUND * max((len(s) for s in strings), default=0) + 1

    def match(self, output_ids: Sequence[int]) -> str | None:
        tail = self.tokenizer.decode(output_ids[-self.window:])
        return next((s for s in self.strings if s in tail), None)


class StopTable:
    """Stop ids and length caps of all rows as tensors; ``select`` follows the cache's row selection."""

    def __init__(self, stop_ids: Sequence[Sequence[int]], max_new_tokens: Sequence[int]):
        width = max((len(ids) for ids in stop_ids), default=0)
        self.stop_ids_BS = torch.full((len(stop_ids), max(width, 1)), -1, dtype=torch.long)
        for row, ids in enumerate(stop_ids):
            self.stop_ids_BS[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        self.max_new_B = torch.as_tensor(list(max_new_tokens), dtype=torch.long)

    def select(self, rows: torch.Tensor) -> None:
        self.stop_ids_BS = self.stop_ids_BS[rows]
        self.max_new_B = self.max_new_B[rows]

    def hit_stop_id(self, tokens_B: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: the token just sampled is one of the row's stop ids."""
        return (tokens_B[:, None] == self.stop_ids_BS).any(-1)

    def at_length(self, generated: int) -> torch.Tensor:
        """``[B]`` bool: the row has generated its cap (all rows of a group decode in lock step)."""
        return self.max_new_B <= generated
