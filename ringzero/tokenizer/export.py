"""A tokenizer as the files of a Hugging Face model folder: ``tokenizer.json`` + ``tokenizer_config.json``.

The char tokenizer becomes a real ``tokenizers`` model that encodes every text it accepts to the same ids:
a WordLevel vocabulary of its characters behind a pre-tokenizer that isolates each character, and a
``Fuse`` decoder (no spaces between tokens). Its specials are exported as ``⟨pad⟩``, ``⟨bos⟩``,
``⟨eos⟩``: characters outside the alphabet, so no text the char tokenizer accepts can spell one (with
``<eos>`` a text containing those five characters would encode to the special id instead).
A ``tokenizers`` JSON tokenizer is exported as its own file.
"""

from __future__ import annotations

import json

from ringzero.tokenizer.base import Tokenizer
from ringzero.tokenizer.char import SPECIALS, CharTokenizer
from ringzero.tokenizer.hf import HFJsonTokenizer

EXPORTED_SPECIALS = tuple(f"\u27e8{s[1:-1]}\u27e9" for s in SPECIALS)  # ⟨pad⟩ ⟨bos⟩ ⟨eos⟩


def char_tokenizer_json(tok: CharTokenizer) -> str:
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {name: i for i, name in enumerate(EXPORTED_SPECIALS)}
    vocab.update({ch: tok.encode(ch)[0] for ch in tok.alphabet})
    hf = HFTokenizer(models.WordLevel(vocab, unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.decoder = decoders.Fuse()
    hf.add_special_tokens(list(EXPORTED_SPECIALS))
    return hf.to_str(pretty=True)


def special_tokens(tok: Tokenizer) -> dict[str, int]:
    """The ids ``config.json`` and ``generation_config.json`` carry."""
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


def tokenizer_files(tok: Tokenizer) -> dict[str, bytes]:
    """``{file name: bytes}`` of the tokenizer's part of a model folder."""
    if isinstance(tok, CharTokenizer):
        tokenizer_json = char_tokenizer_json(tok)
        names = dict(zip(("pad", "bos", "eos"), EXPORTED_SPECIALS, strict=True))
    elif isinstance(tok, HFJsonTokenizer):
        tokenizer_json = tok.path.read_text()
        names = {
            role: tok._tok.id_to_token(tid)
            for role, tid in (("pad", tok.pad_id), ("bos", tok.bos_id), ("eos", tok.eos_id))
        }
    else:
        raise TypeError(f"no model-folder export for a {type(tok).__name__}")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": names["bos"],
        "eos_token": names["eos"],
        "pad_token": names["pad"],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    return {
        "tokenizer.json": tokenizer_json.encode(),
        "tokenizer_config.json": json.dumps(config, indent=2).encode(),
    }
