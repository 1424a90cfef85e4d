"""Character tokenizer: fixed vocabulary, round trips, specials, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringzero.errors import RingzeroError
from ringzero.tokenizer import CharTokenizer, Tokenizer, build_tokenizer
from ringzero.tokenizer.char import DEFAULT_ALPHABET


def test_vocabulary_is_fixed_and_fits_the_tiny_model():
    tok = CharTokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 64  # the tiny config's vocab_size
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.encode("0") == [3] and tok.encode("a") == [13]  # specials, then digits, then letters
    assert CharTokenizer().encode(DEFAULT_ALPHABET) == list(range(3, 64))


@given(st.text(alphabet=DEFAULT_ALPHABET, max_size=60))
def test_round_trip(text):
    tok = CharTokenizer()
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len(text) + 2
    assert tok.decode(ids) == text


def test_markers_are_plain_characters():
    tok = CharTokenizer()
    text = "<think>12+30=42</think> [deep] #### 42"
    ids = tok.encode(text)
    assert len(ids) == len(text) and tok.decode(ids) == text


def test_specials_render_only_when_asked():
    tok = CharTokenizer()
    assert tok.decode([1, 4, 0, 2], skip_special=False) == "<bos>1<pad><eos>"


def test_refusals_name_the_problem():
    tok = CharTokenizer()
    with pytest.raises(RingzeroError, match="'Z' at position 2"):
        tok.encode("12Z")
    with pytest.raises(RingzeroError, match="id 64 is outside"):
        tok.decode([3, 64])
    with pytest.raises(RingzeroError, match="repeats"):
        CharTokenizer("abca")


def test_build_from_run_config():
    from ringzero.config.run import CharTokenizer as CharConfig

    assert isinstance(build_tokenizer(CharConfig()), CharTokenizer)
