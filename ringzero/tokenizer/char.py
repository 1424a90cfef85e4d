"""Character-level tokenizer for synthetic tasks: a fixed, ordered alphabet, one id per character.

Markers such as ``<think>`` or ``[deep]`` are ordinary strings of characters here, so the model has
to learn them like any other text. The default alphabet plus the three specials is exactly 64 ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from ringzero.errors import RingzeroError
from ringzero.tokenizer.base import Tokenizer, UnencodableText

SPECIALS = ("<pad>", "<bos>", "<eos>")  # ids 0, 1, 2
DEFAULT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz \n+-*/=<>()[]{}.,:;?!'_#|"


class CharTokenizer(Tokenizer):
    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, alphabet: str = DEFAULT_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise RingzeroError(f"char tokenizer alphabet repeats {dupes}")
        self.alphabet = alphabet
        self._ids = {c: i + len(SPECIALS) for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.alphabet)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos else []
        ids += [self._ids.get(ch) for ch in text]
        if None in ids:
            raise UnencodableText(
                [(pos, ch) for pos, ch in enumerate(text) if ch not in self._ids],
                "the char tokenizer's alphabet",
            )
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out = []
        for tid in ids:
            tid = int(tid)
            if not 0 <= tid < self.vocab_size:
                raise RingzeroError(
                    f"char tokenizer: id {tid} is outside the vocabulary of {self.vocab_size}"
                )
            if tid < len(SPECIALS):
                if not skip_special:
                    out.append(SPECIALS[tid])
                continue
            out.append(self.alphabet[tid - len(SPECIALS)])
        return "".join(out)
