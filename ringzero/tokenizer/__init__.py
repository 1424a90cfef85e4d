"""Tokenizers behind one interface: character-level for synthetic tasks, HF ``tokenizers`` JSON for real
ones."""

from __future__ import annotations

from ringzero.tokenizer.base import Tokenizer
from ringzero.tokenizer.char import CharTokenizer
from ringzero.tokenizer.hf import HFJsonTokenizer

__all__ = ["Tokenizer", "CharTokenizer", "HFJsonTokenizer", "build_tokenizer"]


def build_tokenizer(cfg) -> Tokenizer:
    """From the run config's ``tokenizer`` section (``kind: char`` or ``kind: hf`` with ``path``)."""
    if cfg.kind == "char":
        return CharTokenizer()
    if cfg.kind == "hf":
        return HFJsonTokenizer(cfg.path)
    raise ValueError(f"unknown tokenizer kind {cfg.kind!r}")
