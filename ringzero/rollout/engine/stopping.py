"""When a row stops: a stop token id (eos included), a stop string in the decoded text, or its length cap.

The token that triggers a stop stays in ``output_ids`` (with its log-prob): the policy has to learn to
emit it, so the trainer must see it. Stop ids are checked for all rows at once on the device; length
caps on the host, which counts the steps. Only rows that have stop strings pay a per-step decode, on a
host copy of their output that grows by the token read back each step. Stop strings are matched on the
text of the *output* only (never the prompt), decoded from a tail window of tokens; since every step
is checked, any match found is one the newest token completed.

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
        tail = self.tokenizer.decode(output_ids[-self.window :])
        return next((s for s in self.strings if s in tail), None)


class StopTable:
    """Stop ids of all rows as a device tensor ``[B, S]``; ``select`` follows the cache's row selection.

    Length caps need no tensor: every row of a group decodes in lock step, so the host knows from the
    step count alone which rows reached theirs.
    """

    def __init__(self, stop_ids: Sequence[Sequence[int]], device: torch.device | str | None = None):
        width = max(max((len(ids) for ids in stop_ids), default=0), 1)
        padded = [list(ids) + [-1] * (width - len(ids)) for ids in stop_ids]
        # Built on the host and copied once: one upload, whatever the number of rows.
        self.stop_ids_BS = torch.tensor(padded, dtype=torch.long, device=device).reshape(len(stop_ids), width)

    def select(self, rows_B: torch.Tensor) -> None:
        self.stop_ids_BS = self.stop_ids_BS[rows_B]

    def cat(self, other: StopTable) -> None:
        """Append ``other``'s rows (rows joining a running batch), padding the narrower table with -1."""
        a, b = self.stop_ids_BS, other.stop_ids_BS
        width = max(a.shape[1], b.shape[1])
        self.stop_ids_BS = torch.cat(
            [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1) for t in (a, b)]
        )

    def hit_stop_id(self, tokens_B: torch.Tensor) -> torch.Tensor:
        """``[B]`` bool: the token just sampled is one of the row's stop ids."""
        return (tokens_B[:, None] == self.stop_ids_BS).any(-1)
