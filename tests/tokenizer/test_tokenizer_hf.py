"""HF ``tokenizers`` JSON files behind the same interface (a tiny word-level file built offline)."""

from __future__ import annotations

import pytest
from ci_require import require_module

from ringzero.errors import RingzeroError
from ringzero.tokenizer import HFJsonTokenizer, Tokenizer, build_tokenizer

tokenizers = require_module("tokenizers")


def _write(tmp_path, specials=("<s>", "</s>", "<pad>")):
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    words = ["the", "cat", "sat", "on", "mat", "[UNK]"]
    vocab = {w: i for i, w in enumerate([*specials, *words])}
    tok = HF(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(specials))
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_round_trip_and_specials(tmp_path):
    tok = HFJsonTokenizer(_write(tmp_path))
    assert isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2) and tok.vocab_size == 9
    ids = tok.encode("the cat sat on the mat", add_bos=True, add_eos=True)
    assert ids == [0, 3, 4, 5, 6, 3, 7, 1]
    assert tok.decode(ids) == "the cat sat on the mat"
    assert tok.decode(ids, skip_special=False).startswith("<s>")


def test_pad_falls_back_to_eos_and_explicit_names_win(tmp_path):
    tok = HFJsonTokenizer(_write(tmp_path, specials=("<|endoftext|>",)), bos="<|endoftext|>")
    assert tok.pad_id == tok.eos_id == tok.bos_id == 0


def test_refusals(tmp_path):
    with pytest.raises(RingzeroError, match="does not exist"):
        HFJsonTokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RingzeroError, match="not a valid tokenizers JSON"):
        HFJsonTokenizer(bad)
    with pytest.raises(RingzeroError, match="no bos token"):
        HFJsonTokenizer(_write(tmp_path, specials=("</s>",)))
    tok = HFJsonTokenizer(_write(tmp_path))
    with pytest.raises(RingzeroError, match="outside the vocabulary"):
        tok.decode([99])


def test_build_from_run_config(tmp_path):
    from ringzero.config.run import HFTokenizer as HFConfig

    path = _write(tmp_path)
    assert isinstance(build_tokenizer(HFConfig(path=str(path))), HFJsonTokenizer)
