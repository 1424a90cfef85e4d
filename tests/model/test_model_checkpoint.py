"""Checkpoints through the store: round trip, and refusals that name the tensor or key at fault."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from model_kit import policy, randomize, tiny_cfg

from ringzero.errors import ConfigError, RingzeroError
from ringzero.model.checkpoint import load_model, save_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.tokenizer import CharTokenizer


@pytest.fixture
def store(tmp_path):
    from ringzero.store import open_store

    return open_store(f"file://{tmp_path}/store", None)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_gives_identical_logits(store, gen, tied):
    cfg = tiny_cfg(tie_word_embeddings=tied)
    model = randomize(HybridLM(cfg, policy("float32")))
    uri = save_model(store, "step-7", model, cfg, meta={"step": 7}, tokenizer=CharTokenizer())
    loaded = load_model(uri, policy("float32"), store=store)
    assert loaded.config == cfg and loaded.meta == {"step": 7} and loaded.uri == uri
    ids = torch.randint(0, 64, (2, 9), generator=gen)
    assert torch.equal(loaded.model(ids), model(ids))
    ckpt = store.load(uri)
    config = ckpt.config
    assert config["architectures"] == ["BailingMoeV2_5ForCausalLM"] and config["torch_dtype"] == "float32"
    assert config["hidden_size"] == cfg.hidden_size and config["layer_group_size"] == 4
    assert (
        "model.layers.3.attention.kv_b_proj.weight" in ckpt.tensors
        and ("lm_head.weight" in ckpt.tensors) != tied
    )
    assert json.loads(ckpt.files["generation_config.json"])["eos_token_id"] == CharTokenizer.eos_id
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(ckpt.files)


def test_load_casts_to_the_policy(store):
    cfg = tiny_cfg()
    save_model(store, "c", randomize(HybridLM(cfg, policy("float32"))), cfg)
    loaded = load_model(store.load("c"), PrecisionPolicy.preset("fp32-islands"))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def _tamper(store, name, change_tensors=None, change_config=None):
    ckpt = store.load(name)
    tensors, config = dict(ckpt.tensors), dict(ckpt.config)
    if change_tensors:
        change_tensors(tensors)
    if change_config:
        change_config(config)
    return SimpleNamespace(tensors=tensors, config=config, meta={}, uri=f"mem://{name}")


@pytest.fixture
def saved(store):
    cfg = tiny_cfg()
    save_model(store, "base", randomize(HybridLM(cfg, policy("float32"))), cfg)
    return store


def test_missing_tensor_is_named(saved):
    bad = _tamper(saved, "base", lambda t: t.pop("model.layers.3.attention.kv_b_proj.weight"))
    with pytest.raises(RingzeroError, match=r"missing tensor model\.layers\.3\.attention\.kv_b_proj\.weight"):
        load_model(bad)


def test_unexpected_tensor_is_named(saved):
    bad = _tamper(saved, "base", lambda t: t.update({"model.layers.2.attention.extra": torch.zeros(2)}))
    with pytest.raises(RingzeroError, match=r"unexpected tensor model\.layers\.2\.attention\.extra"):
        load_model(bad)


def test_shape_mismatch_is_named(saved):
    bad = _tamper(saved, "base", change_config=lambda c: c.update({"intermediate_size": 40}))
    with pytest.raises(
        RingzeroError,
        match=r"tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape "
        r"\[48, 32\], the config needs \[40, 32\]",
    ):
        load_model(bad)


def test_invalid_model_config_names_the_field(saved):
    with pytest.raises(ConfigError, match="num_attention_heads: Input should be greater than or equal to 1"):
        load_model(_tamper(saved, "base", change_config=lambda c: c.update({"num_attention_heads": 0})))


def test_foreign_config_and_bad_sources_are_refused(saved):
    with pytest.raises(RingzeroError, match="ringzero loads 'BailingMoeV2_5ForCausalLM'"):
        load_model(
            _tamper(saved, "base", change_config=lambda c: c.update(architectures=["Qwen2ForCausalLM"]))
        )
    with pytest.raises(RingzeroError, match="pass the store"):
        load_model("base")
    with pytest.raises(RingzeroError, match="differs from the model"):
        save_model(saved, "x", HybridLM(tiny_cfg(), policy("float32")), tiny_cfg(num_hidden_layers=2))
