"""Any dict of tensors the store accepts comes back bit for bit: random dtypes, shapes (empty and
0-d included), contents (NaN payloads, subnormals, every bit pattern) and names (any Unicode)."""

from __future__ import annotations

import tempfile

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_kit import assert_bit_exact

from ringzero.store import open_store

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


@st.composite
def tensors(draw) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    numel = 1
    for n in shape:
        numel *= n
    size = numel * torch.empty((), dtype=dtype).element_size()
    raw = draw(st.binary(min_size=size, max_size=size))
    if dtype == torch.bool:  # only 0 and 1 are valid bool bytes
        return torch.tensor([b & 1 for b in raw], dtype=torch.bool).reshape(shape)
    return (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
        if size
        else torch.empty(shape, dtype=dtype)
    )


names = st.text(max_size=16).filter(lambda s: s != "__metadata__")
state_dicts = st.dictionaries(names, tensors(), max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=state_dicts, max_shard=st.integers(1, 300), meta=st.dictionaries(st.text(max_size=5), st.integers())
)
def test_any_state_dict_round_trips_bit_exactly(state, max_shard, meta):
    with tempfile.TemporaryDirectory() as root:
        store = open_store(f"file://{root}", max_shard_bytes=max_shard)
        uri = store.save("ck", state, {"n": len(state)}, meta)
        ckpt = store.load(uri)
    assert_bit_exact(ckpt.tensors, state)
    assert ckpt.meta == meta
