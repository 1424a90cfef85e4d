"""The tokenizer interface every part of ringzero speaks: ids in, text out, three special ids."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class Tokenizer(ABC):
    """``encode``/``decode`` plus ``vocab_size`` and the ``bos_id``, ``eos_id``, ``pad_id`` specials."""

    bos_id: int
    eos_id: int
    pad_id: int

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({self.bos_id, self.eos_id, self.pad_id})
