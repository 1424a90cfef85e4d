"""RoPE tables shared across the layers of one forward: built once, never served stale."""

import torch

from ringzero.model import rope
from ringzero.model.rope import rope_cos_sin, shared_tables


def test_one_table_per_positions_tensor_inside_a_forward(monkeypatch):
    built = []
    real = rope._cos_sin
    monkeypatch.setattr(rope, "_cos_sin", lambda *a: built.append(a[1:]) or real(*a))
    pos = torch.arange(7)
    with shared_tables():
        first = rope_cos_sin(pos, 16, 1e4, torch.float32)
        again = rope_cos_sin(pos, 16, 1e4, torch.float32)
        other_dim = rope_cos_sin(pos, 8, 1e4, torch.float32)
    assert again[0] is first[0] and len(built) == 2
    assert other_dim[0].shape == (7, 8)
    torch.testing.assert_close(first, rope._cos_sin(pos, 16, 1e4, torch.float32), rtol=0, atol=0)


def test_in_place_change_between_forwards_is_seen():
    pos = torch.arange(5)
    with shared_tables():
        before = rope_cos_sin(pos, 16, 1e4, torch.float32)[0].clone()
    pos += 3  # a caller advancing its positions buffer in place (a static decode cache does)
    with shared_tables():
        after = rope_cos_sin(pos, 16, 1e4, torch.float32)[0]
    assert not torch.equal(before, after)
    assert torch.equal(after, rope._cos_sin(pos, 16, 1e4, torch.float32)[0])


def test_outside_a_forward_nothing_is_kept():
    pos = torch.arange(4)
    assert rope_cos_sin(pos, 16, 1e4, torch.float32)[0] is not rope_cos_sin(pos, 16, 1e4, torch.float32)[0]
