"""The engine's decoding loop lives on its model's device: checked on ``meta`` (no GPU needed) with the
device trap, and on CUDA where there is one. Also tests of the trap itself: it must catch a leak."""

from __future__ import annotations

import pytest
import torch
from device_trap import device_trap
from rollout_kit import assert_close, prompts, requests, tiny_model

import ringzero.rollout.engine.embedded as engine_module
from ringzero.errors import RingzeroError
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

META = torch.device("meta")
MAX_LEN = 32  # the meta model's max_position_embeddings: caps the long request below
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _mixed_requests() -> list[GenerateRequest]:
    """Sampling, top-k, top-p, greedy, stop ids, stop strings, n samples and different caps."""
    ps = prompts([5, 9, 3, 12], seed=2)
    return [
        GenerateRequest(ps[0], SamplingParams(max_new_tokens=10, n=3, seed=5, top_k=5)),
        GenerateRequest(ps[1], SamplingParams(max_new_tokens=70, top_p=0.8, stop=("ab",))),
        GenerateRequest(ps[2], SamplingParams(max_new_tokens=7, temperature=0, stop_token_ids=(9,))),
        GenerateRequest(ps[3], SamplingParams(max_new_tokens=12, temperature=0.7, n=2)),
    ]


def _meta_engine(**kwargs) -> EmbeddedEngine:
    engine = EmbeddedEngine(tiny_model("float64", max_position_embeddings=MAX_LEN).to(META), **kwargs)
    assert engine.device == META
    return engine


# -- the engine on meta ---------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_decode_loop_makes_no_host_tensor_and_reads_back_once_per_step(deterministic):
    engine = _meta_engine(
        tokenizer=CharTokenizer(), max_batch=4, prefill_chunk=4, deterministic=deterministic
    )
    reqs = _mixed_requests()
    with device_trap(META) as trap:
        out = engine.generate(reqs)
    # On meta every read says "no stop sampled", so each row runs to its cap (the room under
    # max_position_embeddings).
    caps = [min(r.params.max_new_tokens, MAX_LEN - len(r.input_ids)) for r in reqs]
    assert [[len(c.output_ids) for c in g] for g in out] == [
        [cap] * r.params.n for cap, r in zip(caps, reqs, strict=True)
    ]
    assert all(c.finish_reason == "length" for g in out for c in g)
    rows = [cap for cap, r in zip(caps, reqs, strict=True) for _ in range(r.params.n)]
    groups = [rows[i : i + 4] for i in range(0, len(rows), 4)]
    # Each group: one stop check per step (eos makes every row watch), its outputs once at the end;
    # deterministic mode decodes through the batch-invariant forward with the same reads, nothing after.
    allowed = sum(max(g) + 2 for g in groups)
    assert len(trap.host_reads) <= allowed
    assert set(trap.host_reads) == {"torch.Tensor.tolist"}  # no .item() or bool() of a device tensor
    assert trap.ops["torch.rand"] == len(rows)  # every row drew its uniforms (64 per draw) on meta


def test_rows_without_stops_read_nothing_back_until_the_end():
    engine, batch = _meta_engine(max_batch=8), requests(prompts([4, 7, 2]), max_new_tokens=12, top_p=0.9)
    with device_trap(META) as trap:
        engine.generate(batch)
    assert trap.host_reads == ["torch.Tensor.tolist"] * 2  # ids and log-probs, after the last step


def test_a_continuous_batch_keeps_joining_and_leaving_rows_on_the_device():
    engine = _meta_engine(tokenizer=CharTokenizer(), max_batch=6, compact_below=0.5)
    first, *later = _mixed_requests()
    batch = engine.open_batch()
    answered = []
    with device_trap(META) as trap:
        batch.admit([first])
        for step in range(MAX_LEN):
            if step < len(later):
                batch.admit([later[step]])  # rows join while others decode; short ones leave meanwhile
            batch.step()
            answered += batch.finished()
    assert len(answered) == 4 and batch.live == 0
    caps = [min(r.params.max_new_tokens, MAX_LEN - len(r.input_ids)) for r in [first, *later]]
    assert [[len(c.output_ids) for c in g] for _, (g,) in sorted(answered)] == [
        [cap] * r.params.n for cap, r in zip(caps, [first, *later], strict=True)
    ]
    assert set(trap.host_reads) == {"torch.Tensor.tolist"}  # stop checks and finished rows' outputs only


def test_a_host_tensor_made_inside_the_decode_loop_is_caught(monkeypatch):
    real = engine_module.sample_next

    def leaky(logits_BV, rows, u_B):
        torch.zeros(logits_BV.shape[0])  # a deliberate leak: no device=
        return real(logits_BV, rows, u_B)

    monkeypatch.setattr(engine_module, "sample_next", leaky)
    engine, batch = _meta_engine(tokenizer=CharTokenizer()), requests(prompts([5]), max_new_tokens=4)
    with pytest.raises(AssertionError, match=r"torch\.zeros made a tensor on cpu"), device_trap(META):
        engine.generate(batch)


def test_cache_checks_tensor_indices_only_when_asked():
    model = tiny_model("float64")
    cache = model.new_cache(2, capacity=4)
    with pytest.raises(RingzeroError, match="out of range"):
        cache.select(torch.tensor([0, 2]))  # checked: reads the indices back
    cache.select(torch.tensor([1, 1, 0]), check=False)  # the decoding loop's indices: valid by construction
    assert cache.batch_size == 3
    with pytest.raises(RingzeroError, match="out of range"):
        cache.select([3], check=False)  # host indices are always checked: it costs nothing


# -- the trap itself ------------------------------------------------------------------------------


def test_trap_names_the_op_that_makes_or_mixes_a_host_tensor():
    x = torch.zeros(3, device=META)
    host = torch.ones(3)
    leaks = [
        (lambda: torch.arange(4), r"torch\.arange made a tensor on cpu"),
        (lambda: torch.tensor([1, 2]), r"torch\.tensor made a tensor on cpu"),
        (lambda: x + host, r"torch\.Tensor\.add uses a tensor on cpu"),
        (lambda: torch.where(x > 0, x, host), r"torch\.where uses a tensor on cpu"),
        (lambda: x.cpu(), r"torch\.Tensor\.cpu made a tensor on cpu"),
        (lambda: x.to("cpu"), r"torch\.Tensor\.to made a tensor on cpu"),
        (lambda: host.to(META), r"torch\.Tensor\.to uses a tensor on cpu"),
        (lambda: torch.rand(3, generator=torch.Generator(), device=META), "draws with a generator on cpu"),
    ]
    for leak, message in leaks:
        with pytest.raises(AssertionError, match=message), device_trap(META):
            leak()


def test_trap_lets_device_work_and_uploads_through_and_counts_host_reads():
    x = torch.zeros(2, 3, device=META)
    with device_trap(META) as trap:
        y = (x * 2).sum(-1) + torch.tensor([1.0, 2.0], device=META)
        g = torch.Generator(device=META)  # a stand-in: torch has no meta generators
        u = torch.rand(4, generator=g.manual_seed(3), device=META)
        assert y.shape == (2,) and u.device == META and x.shape[1] == 3
        assert y.tolist() == [0.0, 0.0] and not bool((y > 0).any()) and int(y.sum().long()) == 0
    assert trap.host_reads == ["torch.Tensor.tolist", "torch.Tensor.__bool__", "torch.Tensor.__int__"]
    assert torch.Generator is torch._C.Generator  # restored on exit


def test_trap_refuses_host_reads_when_told_to():
    x = torch.zeros(2, device=META)
    with (
        pytest.raises(AssertionError, match=r"torch\.Tensor\.tolist reads a meta tensor back"),
        device_trap(META, allow_host_reads=False),
    ):
        x.tolist()


def test_trap_still_fails_when_the_code_swallows_the_error():
    with (
        pytest.raises(AssertionError, match=r"1 device violation\(s\), first: .*torch\.ones"),
        device_trap(META),
    ):
        try:
            torch.ones(2)
        except Exception:  # noqa: BLE001 - the code under test hides it; the trap must not
            pass


# -- on a real accelerator ------------------------------------------------------------------------


@cuda
def test_cuda_engine_stays_on_the_gpu_and_keeps_its_guarantees():
    gpu = torch.device("cuda")
    model = tiny_model("float64")
    engine, batch = EmbeddedEngine(model.to(gpu), CharTokenizer(), max_batch=3), _mixed_requests()
    with device_trap(gpu) as trap:
        engine.generate(batch)
    assert set(trap.host_reads) == {"torch.Tensor.tolist"}
    # Seeded rows: reproducible, and blind to their batch neighbours (on one device type).
    probe = GenerateRequest(prompts([6])[0], SamplingParams(max_new_tokens=16, top_p=0.95, seed=1234))
    alone = engine.generate([probe])[0][0]
    assert EmbeddedEngine(model, max_batch=8).generate([probe])[0][0].output_ids == alone.output_ids
    others = requests(prompts([11, 2, 7], seed=5), max_new_tokens=9, temperature=0.8, top_k=4)
    crowded = EmbeddedEngine(model, max_batch=3, seed=99).generate([others[0], probe, *others[1:]])[1][0]
    assert crowded.output_ids == alone.output_ids
    assert_close(crowded.output_logprobs, alone.output_logprobs, torch.float64)
    # Greedy decoding does not depend on the device.
    batch = requests(prompts([9, 2, 14]), max_new_tokens=12, temperature=0)
    on_gpu = EmbeddedEngine(model, max_batch=2).generate(batch)
    on_cpu = EmbeddedEngine(tiny_model("float64"), max_batch=2).generate(batch)
    for (g,), (c,) in zip(on_gpu, on_cpu, strict=True):
        assert g.output_ids == c.output_ids
        assert_close(g.output_logprobs, c.output_logprobs, torch.float64)
