"""Checkpoints are Ling 2.5 folders: ringzero's model against an independent implementation of the
published architecture, export/import round trips, and refusals that name what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ringzero.cli.main import main
from ringzero.errors import ConfigError, RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hf_folder import check_folder, load_folder, write_folder
from ringzero.model.hybrid import HybridLM
from ringzero.model.lightning import decay_slopes
from ringzero.model.routing import capture_routing
from tests.model.ling_reference_impl import (
    read_folder,
    reference_logits,
    tiny_config,
    tiny_moe_config,
    write_reference_folder,
)
from tests.model.model_kit import randomize
from tests.model.model_tolerances import assert_close

F64 = torch.float64
FP64 = PrecisionPolicy.preset("fp64")


def _ids(vocab: int, B: int = 2, S: int = 11, seed: int = 3):
    return torch.randint(0, vocab, (B, S), generator=torch.Generator().manual_seed(seed))


CASES = {
    "dense": tiny_config(),
    "dense_q_lora_tail": tiny_config(q_lora_rank=12, num_hidden_layers=5, layer_group_size=2),
    "moe": tiny_moe_config(),
    "moe_6_heads_tied": tiny_moe_config(
        num_attention_heads=6,
        group_norm_size=3,
        tie_word_embeddings=True,
        routed_scaling_factor=2.5,
        first_k_dense_replace=0,
    ),
    "not_interleaved": tiny_config(rope_interleave=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_folder_from_an_independent_writer_loads_and_matches_its_forward(tmp_path, case):
    """A folder written by the test-side reference (not by ringzero) loads, and ringzero's fp64 logits
    equal the reference forward under SGLang's decay rule (the one ringzero trains with)."""
    config = CASES[case]
    write_reference_folder(tmp_path / "ref", config, seed=1)
    _, tensors = read_folder(tmp_path / "ref")
    loaded = load_folder(tmp_path / "ref", FP64)
    ids = _ids(config["vocab_size"])
    want, routing = reference_logits(
        config, {k: v.to(F64) for k, v in tensors.items()}, ids, slope_rule="sglang", return_routing=True
    )
    with capture_routing(loaded.model) as chosen:
        got = loaded.model(ids)
    assert_close(got, want, F64)
    assert sorted(chosen) == sorted(routing)
    for layer, experts in routing.items():  # the same experts per token (order within a token aside)
        assert torch.equal(chosen[layer].sort(-1).values, experts.sort(-1).values)


def test_hf_decay_rule_is_one_layer_shallower_than_sglangs():
    sglang, hf = decay_slopes(4, 3, 8), decay_slopes(4, 2, 8)
    assert decay_slopes(4, 3, 8, rule="hf") == pytest.approx(decay_slopes(4, 2, 8, rule="sglang"))
    assert sglang != hf and decay_slopes(4, 0, 1) == decay_slopes(4, 0, 1, rule="hf")  # one layer: no depth


@pytest.mark.parametrize(
    "cfg",
    [ModelConfig(), ModelConfig(num_experts=4, n_group=2, first_k_dense_replace=1, tie_word_embeddings=True)],
    ids=["dense", "moe"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_then_load_is_bitwise(tmp_path, cfg, dtype):
    model = randomize(HybridLM(cfg, PrecisionPolicy.preset("fp32")))
    write_folder(tmp_path / "out", cfg, model.state_dict(), dtype=dtype)
    back = load_folder(tmp_path / "out", PrecisionPolicy.preset("fp32")).model
    for name, value in model.state_dict().items():
        want = value if "expert_bias" in name else value.to(dtype).to(value.dtype)
        assert torch.equal(back.state_dict()[name], want), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (
        config["architectures"] == ["BailingMoeV2_5ForCausalLM"] and config["model_type"] == "bailing_hybrid"
    )


def test_exported_folder_reads_back_in_the_reference_implementation(tmp_path):
    """The other direction: what ringzero writes, the independent reader loads and its forward agrees."""
    cfg = ModelConfig(
        vocab_size=48,
        hidden_size=32,
        num_hidden_layers=4,
        layer_group_size=2,
        head_dim=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        kv_lora_rank=12,
        intermediate_size=40,
        group_norm_size=2,
        num_experts=4,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
    )
    model = randomize(HybridLM(cfg, FP64))
    write_folder(tmp_path / "out", cfg, model.state_dict(), dtype=torch.float64)
    config, tensors = read_folder(tmp_path / "out")
    ids = _ids(48)
    assert_close(model(ids), reference_logits(config, tensors, ids, slope_rule="sglang"), F64)


def _write_broken(tmp_path, edit):
    write_reference_folder(tmp_path / "ref", tiny_config(), seed=0)
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    tensors = load_file(tmp_path / "ref" / "model.safetensors")
    config, tensors = edit(config, tensors) or (config, tensors)
    (tmp_path / "ref" / "config.json").write_text(json.dumps(config))
    save_file(tensors, tmp_path / "ref" / "model.safetensors")
    return tmp_path / "ref"


def test_import_refuses_a_wrong_shape_and_a_missing_tensor_naming_both(tmp_path):
    def edit(config, tensors):
        tensors["model.layers.0.attention.g_proj.weight"] = torch.zeros(3, 3)
        del tensors["model.layers.1.attention.kv_b_proj.weight"]

    folder = _write_broken(tmp_path, edit)
    with pytest.raises(RingzeroError) as err:
        check_folder(folder)
    assert "tensor model.layers.0.attention.g_proj.weight has shape [3, 3], the config needs [32, 32]" in str(
        err.value
    )
    assert "missing tensor model.layers.1.attention.kv_b_proj.weight" in str(err.value)
    assert main(["import", str(folder), "--to", f"file://{tmp_path}/store/base"]) == 2
    assert not (tmp_path / "store" / "base").exists()  # nothing half-written


def test_import_refuses_an_unknown_architecture_and_unsupported_keys(tmp_path):
    folder = _write_broken(tmp_path, lambda c, t: c.update(architectures=["LlamaForCausalLM"]))
    with pytest.raises(RingzeroError, match="architectures is \\['LlamaForCausalLM'\\]"):
        check_folder(folder)
    folder = _write_broken(
        tmp_path,
        lambda c, t: c.update(architectures=["BailingMoeV2_5ForCausalLM"], linear_silu=True, use_bias=True),
    )
    with pytest.raises(ConfigError) as err:
        check_folder(folder)
    assert "linear_silu is True" in str(err.value) and "use_bias / use_qkv_bias must be false" in str(
        err.value
    )


def test_earlier_format_is_refused_with_how_to_convert(tmp_path):
    folder = _write_broken(
        tmp_path, lambda c, t: c.update(architectures=["RingzeroHybridLM"], ringzero_format=1)
    )
    with pytest.raises(RingzeroError, match="convert it once with `ringzero convert"):
        check_folder(folder)


def test_mtp_layers_of_a_published_checkpoint_are_dropped_on_import(tmp_path):
    def edit(config, tensors):
        config["num_nextn_predict_layers"] = 1  # a published folder's MTP layer, which ringzero drops
        tensors["model.layers.4.eh_proj.weight"] = torch.zeros(32, 64)
        tensors["model.layers.4.mlp.gate_proj.weight"] = torch.zeros(40, 32)

    folder = _write_broken(tmp_path, edit)
    assert check_folder(folder).num_hidden_layers == 4


def test_cli_export_import_serve_folder_round_trip(tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", "--init", "random", "--config", "configs/tiny-cpu.yaml", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert main(["import", str(out), "--to", f"file://{tmp_path}/store/bases/tiny"]) == 0
    from ringzero.model.checkpoint import load_model

    a = load_folder(out).model.state_dict()
    b = load_model(f"file://{tmp_path}/store/bases/tiny").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (
        main(["export", "--init", "random", "--config", "configs/tiny-cpu.yaml", str(out)]) == 2
    )  # not empty


def test_sglang_servability_is_checked_against_its_loader():
    from ringzero.model.sglang_loader import SGLANG_VERSION, sglang_problems

    assert sglang_problems(ModelConfig(num_hidden_layers=16, layer_group_size=8, head_dim=32)) == []
    # MLA at layers 1 and 3 loads in SGLang 0.5.23 (its load_weights maps .dense. to .o_proj. at every layer)
    assert sglang_problems(ModelConfig(num_hidden_layers=4, layer_group_size=2)) == []
    assert any(
        "must be a multiple of layer_group_size" in p
        for p in sglang_problems(ModelConfig(num_hidden_layers=10, layer_group_size=8))
    )
    (tied,) = sglang_problems(ModelConfig(num_hidden_layers=4, layer_group_size=2, tie_word_embeddings=True))
    assert tied.startswith("tie_word_embeddings: true") and "AttributeError" in tied
    (other,) = sglang_problems(ModelConfig(), version="0.6.0")
    assert f"read from SGLang {SGLANG_VERSION}'s loader" in other


def test_null_shared_experts_are_written_as_zero_and_load_back_the_same_model(tmp_path):
    """SGLang 0.5.23 tests ``num_shared_experts > 0``: a null would raise there, 0 means the same."""
    from ringzero.model.hf_format import hf_config, model_config_from_hf

    moe = dict(
        num_hidden_layers=4,
        layer_group_size=2,
        num_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=32,
    )
    doc = hf_config(ModelConfig(**moe, num_shared_experts=None), torch.float32)
    assert doc["num_shared_experts"] == 0
    back = model_config_from_hf(doc, "config.json")
    assert (back.num_shared_experts or 0) == 0 and back.num_experts == 4
    torch.manual_seed(0)
    fp32 = PrecisionPolicy.preset("fp32")
    a = randomize(HybridLM(ModelConfig(**moe, num_shared_experts=None), fp32))
    b = HybridLM(back, fp32)
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, a.cfg.vocab_size, (1, 6))
    assert torch.equal(a(ids), b(ids))
    assert hf_config(ModelConfig(**moe, num_shared_experts=2), torch.float32)["num_shared_experts"] == 2
