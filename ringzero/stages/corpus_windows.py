"""Pretraining batches: windows of the task's corpus that each start at a document boundary.

Every window opens with BOS and a fresh document, exactly as an RL prompt opens with BOS and
``q: ...``; documents follow one another (joined with ``DOC_SEPARATOR``) until the window is full and
the last one is cut. A batch depends only on the run seed and the step number, so a resumed run reads
the very batches an uninterrupted one would have, without saving any reader state.
"""

from __future__ import annotations

import random

import torch

from ringzero.engines.builders import seeded
from ringzero.tasks.chatter import DOC_SEPARATOR
from ringzero.tokenizer.base import Tokenizer


class CorpusWindows:
    def __init__(self, task, tokenizer: Tokenizer, seq_len: int, seed: int):
        self.corpus = task.corpus()
        self.tokenizer, self.seq_len, self.seed = tokenizer, seq_len, seed
        self._separator = tokenizer.encode(DOC_SEPARATOR)

    def window(self, rng: random.Random) -> list[int]:
        ids = [self.tokenizer.bos_id]
        while len(ids) < self.seq_len + 1:
            ids += self.tokenizer.encode(self.corpus.document(rng)) + self._separator
        return ids[: self.seq_len + 1]

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        """``[batch_size, seq_len + 1]`` token ids: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
        rng = random.Random(seeded(self.seed, "pretrain-batch", step))
        return torch.tensor([self.window(rng) for _ in range(batch_size)], dtype=torch.long)
