"""Hugging Face ``tokenizers`` JSON files (``tokenizer.json``) behind the ringzero interface.

Text a file cannot encode is refused by name: a vocabulary without an unknown token (the char tokenizer's
export, a WordLevel or WordPiece model with ``unk_token`` null) makes ``tokenizers`` fail the whole text
("Missing [UNK] token from the vocabulary"), so ``encode`` finds the pieces that have no token and raises
``UnencodableText`` with their positions; lone surrogates (no UTF-8 form, which ``tokenizers`` needs) are
refused the same way. Any other failure of the library is a ``RingzeroError`` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ringzero.errors import RingzeroError
from ringzero.tokenizer.base import Tokenizer, UnencodableText

# Tried in order when a special is not named explicitly.
CANDIDATES = {
    "bos": ("<|begin_of_text|>", "<|startoftext|>", "<s>", "[BOS]", "<bos>", "\u27e8bos\u27e9"),
    "eos": ("<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>", "[EOS]", "<eos>", "\u27e8eos\u27e9"),
    "pad": ("<|pad|>", "<pad>", "[PAD]", "\u27e8pad\u27e9"),
}


class HFJsonTokenizer(Tokenizer):
    """Specials come from the arguments, else the first known name found in the vocabulary; a missing
    pad falls back to eos (padding is masked anyway), a missing bos or eos is an error."""

    def __init__(
        self, path: str | Path, bos: str | None = None, eos: str | None = None, pad: str | None = None
    ):
        from tokenizers import Tokenizer as _HF

        path = Path(path)
        if not path.is_file():
            raise RingzeroError(f"tokenizer file {path} does not exist")
        try:
            self._tok = _HF.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise RingzeroError(f"tokenizer file {path} is not a valid tokenizers JSON file: {exc}") from None
        self.path = path
        self.bos_id = self._special("bos", bos)
        self.eos_id = self._special("eos", eos)
        self.pad_id = self._special("pad", pad, fallback=self.eos_id)

    def _special(self, role: str, name: str | None, fallback: int | None = None) -> int:
        names = (name,) if name else CANDIDATES[role]
        for candidate in names:
            tid = self._tok.token_to_id(candidate)
            if tid is not None:
                return tid
        if fallback is not None and not name:
            return fallback
        raise RingzeroError(f"{self.path}: no {role} token among {list(names)}; name it explicitly")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # tokenizers raises bare Exceptions (and TypeError for a lone surrogate)
            found = self._unencodable(text)
            if found:
                raise UnencodableText(
                    found, "the tokenizer's vocabulary, which has no unknown token"
                ) from None
            raise RingzeroError(
                f"the tokenizer cannot encode this text: {type(exc).__name__}: {exc}"
            ) from None
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def _unencodable(self, text: str) -> list[tuple[int, str]]:
        """``(position, piece)`` of each piece of ``text`` the model has no token for: the pre-tokenizer's
        pieces (each character, for the char tokenizer's export) outside the added tokens, tried one by
        one."""
        surrogates = [(i, ch) for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"]
        if surrogates:
            return surrogates
        normalizer, pre = self._tok.normalizer, self._tok.pre_tokenizer
        if normalizer is not None:  # positions then count in the normalized text
            text = normalizer.normalize_str(text)
        taken = [False] * len(text)  # added tokens (the specials) match before the model sees the text
        for token in self._tok.get_added_tokens_decoder().values():
            at = text.find(token.content) if token.content else -1
            while at != -1:
                taken[at : at + len(token.content)] = [True] * len(token.content)
                at = text.find(token.content, at + 1)
        pieces = pre.pre_tokenize_str(text) if pre is not None else [(text, (0, len(text)))]
        found = []
        for piece, (start, end) in pieces:
            if any(taken[start:end]):
                continue
            try:
                self._tok.model.tokenize(piece)
            except Exception:  # noqa: BLE001 - this piece is one the model cannot encode
                found.append((start, piece))
        return found

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise RingzeroError(f"{self.path}: ids {bad[:5]} are outside the vocabulary of {self.vocab_size}")
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        return self._tok.decode(ids, skip_special_tokens=False)
