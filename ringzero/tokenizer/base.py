"""The tokenizer interface every part of ringzero speaks: ids in, text out, three special ids."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ringzero.errors import RingzeroError


class Tokenizer(ABC):
    """``encode``/``decode`` plus ``vocab_size`` and the ``bos_id``, ``eos_id``, ``pad_id`` specials.

    ``encode`` raises ``UnencodableText`` for text it has no tokens for (neither tokenizer here has an
    unknown token to stand in), and a ``RingzeroError`` for any other text it cannot encode."""

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


MAX_NAMED = 8
"""Pieces an ``UnencodableText`` message names; the rest are counted."""


def _piece(text: str) -> str:
    """A piece quoted for a message: ``repr`` shows control characters and lone surrogates as escapes."""
    return repr(text) if len(text) <= 24 else repr(text[:24]) + "..."


class UnencodableText(RingzeroError):
    """Text holding characters (or, for a word-level vocabulary, words) that have no token.

    ``found`` lists ``(position, piece)`` in the order they occur, positions counted in characters
    (code points) of the text as given; the message names the first ``MAX_NAMED`` of them, e.g.
    ``'T' at position 0 and 'F' at position 15 are not in the tokenizer's vocabulary, which has no unknown
    token``.
    """

    def __init__(self, found: Sequence[tuple[int, str]], vocabulary: str):
        self.found = list(found)
        named = [f"{_piece(piece)} at position {pos}" for pos, piece in self.found[:MAX_NAMED]]
        if len(self.found) > MAX_NAMED:
            named.append(f"{len(self.found) - MAX_NAMED} more")
        listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        verb = "is" if len(self.found) == 1 else "are"
        super().__init__(f"{listed} {verb} not in {vocabulary}")
