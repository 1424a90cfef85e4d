"""The char tokenizer exported as a real ``tokenizers`` model encodes and decodes exactly as ringzero's."""

from __future__ import annotations

import random

import pytest

from ringzero.tokenizer import CharTokenizer, HFJsonTokenizer
from ringzero.tokenizer.export import EXPORTED_SPECIALS, tokenizer_files


@pytest.fixture
def folder(tmp_path):
    for name, data in tokenizer_files(CharTokenizer()).items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _texts(tok: CharTokenizer, n=200, seed=0):
    rng = random.Random(seed)
    fixed = ["", " ", "\n\n", "a: 1+2 = 3\n<think>", "<eos><pad><bos>", "[deep] x|y_z#"]
    return fixed + ["".join(rng.choice(tok.alphabet) for _ in range(rng.randint(1, 80))) for _ in range(n)]


def test_tokenizers_library_encodes_and_decodes_identically(folder):
    from tokenizers import Tokenizer

    tok, hf = CharTokenizer(), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in _texts(tok):
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=True).ids == ids, text
        assert hf.decode(ids) == text
    assert [hf.token_to_id(s) for s in EXPORTED_SPECIALS] == [tok.pad_id, tok.bos_id, tok.eos_id]


def test_transformers_autotokenizer_reads_the_folder(folder):
    from transformers import AutoTokenizer

    tok, hf = CharTokenizer(), AutoTokenizer.from_pretrained(str(folder))
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
    for text in _texts(tok, n=50, seed=1):
        assert hf(text)["input_ids"] == tok.encode(text)
        assert hf.decode(tok.encode(text, add_bos=True, add_eos=True), skip_special_tokens=True) == text


def test_ringzero_reads_its_export_back_with_the_same_specials(folder):
    tok, back = CharTokenizer(), HFJsonTokenizer(folder / "tokenizer.json")
    assert (back.pad_id, back.bos_id, back.eos_id, back.vocab_size) == (
        tok.pad_id,
        tok.bos_id,
        tok.eos_id,
        64,
    )
    for text in _texts(tok, n=50, seed=2):
        assert back.encode(text, add_bos=True) == tok.encode(text, add_bos=True)
        assert back.decode(tok.encode(text, add_eos=True)) == text
