"""StaticDecodeCache against DecodeCache: the same logits for left-padded prefill and decoding, fixed
buffer addresses and no host reads in a step (what a CUDA graph needs), refusal past capacity."""

from __future__ import annotations

import contextlib

import pytest
import torch
from model_kit import randomize, tiny_cfg

from ringzero.model.cache import left_padded
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.static_cache import new_static_cache
from ringzero.model.tolerances import compare

STEPS = 20
MODES = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}


def _model(preset: str) -> HybridLM:
    model = HybridLM(tiny_cfg(layer_group_size=2), PrecisionPolicy.preset(preset))  # L M L M
    assert {b.kind for b in model.layers} == {"mla", "lightning"}
    return randomize(model)


def _inputs(gen, lengths=(9, 4, 6)):
    prompts = [torch.randint(1, 64, (n,), generator=gen).tolist() for n in lengths]
    ids, pos = left_padded(prompts, pad_id=0)
    return ids, pos, torch.randint(1, 64, (len(lengths), STEPS, 1), generator=gen)


@contextlib.contextmanager
def _no_host_reads(monkeypatch):
    """Any Python-level read of a tensor's value to the host (a sync on a GPU) raises."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a decoding step read a tensor back to the host")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"):
            m.setattr(torch.Tensor, name, refuse)
        yield


def _addresses(cache) -> list[int]:
    return [t.data_ptr() for t in cache.buffers()]


@pytest.mark.parametrize("preset", ["fp32", "fp64"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_static_cache_decodes_like_the_dynamic_cache(preset, mode, gen, monkeypatch):
    model = _model(preset)
    ids, pos, steps = _inputs(gen)
    B, T = ids.shape
    split = 3  # the prompt in two chunks: a multi-column append at a nonzero write index
    with MODES[mode]():
        dynamic = model.new_cache(B)
        static = new_static_cache(model, B, capacity=T + STEPS)  # exactly full at the end
        addresses = _addresses(static)
        for a, b in ((0, split), (split, T)):
            want = model(ids[:, a:b], pos[:, a:b], cache=dynamic)
            got = model(ids[:, a:b], pos[:, a:b], cache=static)
            assert compare(got, want, want.dtype)["ok"]
        assert torch.equal(static.next_positions(), dynamic.next_positions())
        for s in range(STEPS):
            want = model(steps[:, s], cache=dynamic)
            with _no_host_reads(monkeypatch):
                got = model(steps[:, s], cache=static)
            result = compare(got, want, want.dtype)
            assert result["ok"], (s, result)
            assert _addresses(static) == addresses
        assert static.length == T + STEPS == dynamic.length
        assert torch.equal(static.positions, dynamic.positions)


def test_writing_past_capacity_is_refused(gen):
    model = _model("fp32")
    ids, pos, steps = _inputs(gen)
    B, T = ids.shape
    with torch.inference_mode():
        with pytest.raises(ValueError, match=f"capacity {T - 1} .*requested length {T}"):
            model(ids, pos, cache=new_static_cache(model, B, capacity=T - 1))
        cache = new_static_cache(model, B, capacity=T + 2)
        model(ids, pos, cache=cache)
        model(steps[:, 0], cache=cache)
        model(steps[:, 1], cache=cache)
        positions = cache.positions.clone()
        with pytest.raises(ValueError, match=f"capacity {T + 2} .*requested length {T + 3}"):
            model(steps[:, 2], cache=cache)
        assert cache.length == T + 2 and torch.equal(cache.positions, positions)  # refused before writing


def test_reset_empties_in_place_and_decodes_the_same_bits_again(gen):
    model = _model("fp32")
    ids, pos, steps = _inputs(gen)
    with torch.inference_mode():
        cache = new_static_cache(model, ids.shape[0], capacity=ids.shape[1] + 5)
        addresses = _addresses(cache)

        def run():
            out = [model(ids, pos, cache=cache)[:, -1]]
            out += [model(steps[:, s], cache=cache)[:, -1] for s in range(5)]
            return torch.stack(out)

        first = run()
        cache.reset()
        assert cache.length == 0 and bool((cache.positions == -1).all())
        assert torch.equal(run(), first)
        assert _addresses(cache) == addresses
