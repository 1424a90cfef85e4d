"""Any file content loads cleanly or fails as a RingzeroError naming the file, the line and what is wrong."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringzero.errors import RingzeroError
from ringzero.tasks.jsonl import load_problems

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
keys = st.sampled_from(["question", "answer", "q", "a", "id", ""])
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(keys, kids, max_size=4)),
    max_leaves=12,
)
records = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "question": st.one_of(st.text(max_size=20), trees),
            "answer": st.one_of(st.text(max_size=20), st.integers(), trees),
            "id": trees,
        },
    ),
    trees,
)


def _line(record) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


broken_lines = st.one_of(
    records.map(_line),
    records.map(_line).flatmap(lambda raw: st.integers(0, len(raw)).map(lambda n: raw[:n])),  # truncated
    st.binary(max_size=40),  # bad UTF-8 among other things
    st.sampled_from(
        [
            b"",
            b"   ",
            b"\r",
            b"\xff\xfe",
            b"\xef\xbb\xbf{}",
            b'{"question": "\\ud800", "answer": 1}',
            b'{"question": "q", "answer": 1e999}',
            b'{"question": "q", "answer": ' + b"9" * 5000 + b"}",
            b"[" * 3000 + b"]" * 3000,
            b'{"question": "' + b"x" * 200_000 + b'", "answer": "1"}',
        ]
    ),
)
files = st.lists(broken_lines, max_size=8).map(lambda lines: b"\n".join(lines))
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load(data: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        path.write_bytes(data)
        return path, load_problems(path, "question", "answer", "train")


def _load_or_error(data: bytes):
    try:
        return load(data), None
    except RingzeroError as exc:
        return None, str(exc)


@FUZZ
@given(files)
def test_any_content_loads_or_names_file_and_line(data):
    loaded, error = _load_or_error(data)
    if loaded is not None:
        _, problems = loaded
        assert problems and all(p.prompt and p.answer is not None for p in problems)
        for p in problems:
            p.prompt.encode("utf-8")  # every loaded text is valid Unicode
        return
    assert "train.jsonl" in error
    if "malformed line" in error:
        reported = re.findall(r"train\.jsonl:(\d+): (.+)", error)
        assert reported, error
        count = len(data.split(b"\n"))
        assert all(1 <= int(n) <= count and why.strip() for n, why in reported), error
    else:
        assert "no problems" in error, error


@pytest.mark.parametrize(
    "line, why",
    [
        (b"\xff\xfe", "not valid UTF-8 (byte 0xff at column 1)"),
        (b'{"question": "a", "answer": NaN}', "NaN is not valid JSON"),
        (b'{"question": "a", "answer": 1e999}', "field 'answer' must be a finite number"),
        (b'{"question": "\\ud800", "answer": "1"}', "field 'question' holds '\\ud800'"),
        (b"[" * 3000 + b"]" * 3000, "nests too deeply"),
        (b'{"question": "a", "answer": ' + b"9" * 5000 + b"}", "an integer of more than 4300 digits"),
        (b'{"question": "a"', "Expecting"),
        (b'{"question": ["a"], "answer": "1"}', "field 'question' must be a string or a number (got list)"),
        (b'{"answer": "1"}', "missing field 'question'"),
        (b'{"question": "a", "answer": " "}', "field 'answer' is empty"),
        (b"[1, 2]", "expected a JSON object (got list)"),
    ],
    ids=[
        "utf8",
        "nan",
        "inf",
        "surrogate",
        "deep",
        "bigint",
        "truncated",
        "type",
        "missing",
        "empty",
        "array",
    ],
)
def test_each_kind_of_bad_line_is_named(line, why):
    good = _line({"question": "q", "answer": "1"})
    _, error = _load_or_error(good + b"\n\n" + line + b"\n" + good + b"\n")
    assert error is not None and re.search(r"train\.jsonl:3: ", error), error
    assert why in error, error


def test_a_byte_order_mark_and_crlf_line_ends_load():
    (_, problems), _ = _load_or_error(
        b'\xef\xbb\xbf{"question": "q", "answer": "#### 7"}\r\n\r\n{"question": "r", "answer": 8}\r\n'
    )
    assert [(p.id, p.answer) for p in problems] == [("train:1", "7"), ("train:3", "8")]


def test_a_folder_is_not_a_file(tmp_path):
    with pytest.raises(RingzeroError, match="a folder, not a JSONL file"):
        load_problems(tmp_path, "question", "answer", "train")
