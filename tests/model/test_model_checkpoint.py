"""Checkpoints: round trip through a store, and refusals that name the tensor at fault.

Until ``ringzero.store`` exports ``open_store``, a stand-in with the contract's ``save``/``load`` serialises
through safetensors bytes and JSON, so the same things break as with the real store (shared storage,
non-JSON configs).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from model_kit import policy, randomize, tiny_cfg
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ringzero.errors import ConfigError, RingzeroError
from ringzero.model.checkpoint import load_model, save_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM


class StandInStore:
    def __init__(self):
        self.items = {}

    def save(self, name, tensors, config, meta=None):
        self.items[name] = (st_save(tensors), json.dumps(config), json.dumps(meta or {}))
        return f"mem://{name}"

    def load(self, uri_or_name):
        name = uri_or_name.removeprefix("mem://")
        blob, config, meta = self.items[name]
        return SimpleNamespace(tensors=st_load(blob), config=json.loads(config), meta=json.loads(meta),
                               uri=f"mem://{name}")


@pytest.fixture
def store(tmp_path):
    """The real file:// store once it exists, else the stand-in."""
    try:
        from ringzero.store import open_store
    except ImportError:
        return StandInStore()
    return open_store(f"file://{tmp_path}/store", None)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_gives_identical_logits(store, gen, tied):
    cfg = tiny_cfg(tie_word_embeddings=tied)
    model = randomize(HybridLM(cfg, policy("float32")))
    uri = save_model(store, "step-7", model, cfg, meta={"step": 7})
    loaded = load_model(uri, policy("float32"), store=store)
    assert loaded.config == cfg and loaded.meta == {"step": 7} and loaded.uri == uri
    ids = torch.randint(0, 64, (2, 9), generator=gen)
    assert torch.equal(loaded.model(ids), model(ids))
    config = store.load(uri).config
    assert config["hidden_size"] == cfg.hidden_size and config["torch_dtype"] == "float32"
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]


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
    bad = _tamper(saved, "base", lambda t: t.pop("layers.3.attn.kv_b_proj.weight"))
    with pytest.raises(RingzeroError, match=r"missing tensor layers\.3\.attn\.kv_b_proj\.weight"):
        load_model(bad)


def test_unexpected_tensor_is_named(saved):
    bad = _tamper(saved, "base", lambda t: t.update({"layers.9.attn.extra": torch.zeros(2)}))
    with pytest.raises(RingzeroError, match=r"unexpected tensor layers\.9\.attn\.extra"):
        load_model(bad)


def test_shape_mismatch_is_named(saved):
    def change(config):
        config["ringzero_model"] = {**config["ringzero_model"], "intermediate_size": 40}
        config["intermediate_size"] = 40

    bad = _tamper(saved, "base", change_config=change)
    with pytest.raises(RingzeroError, match=r"tensor layers\.0\.mlp\.gate_proj\.weight has shape \[48, 32\], the config needs \[40, 32\]"):
        load_model(bad)


def test_config_disagreeing_with_its_hf_keys_is_refused(saved):
    bad = _tamper(saved, "base", change_config=lambda c: c.update({"hidden_size": 99}))
    with pytest.raises(RingzeroError, match="hidden_size"):
        load_model(bad)


def test_invalid_model_config_names_the_field(saved):
    def change(config):
        config["ringzero_model"] = {**config["ringzero_model"], "num_attention_heads": 0}

    with pytest.raises(ConfigError, match="ringzero_model.num_attention_heads"):
        load_model(_tamper(saved, "base", change_config=change))


def test_foreign_config_and_bad_sources_are_refused(saved):
    with pytest.raises(RingzeroError, match="not a ringzero model checkpoint"):
        load_model(_tamper(saved, "base", change_config=lambda c: c.pop("ringzero_format")))
    with pytest.raises(RingzeroError, match="pass the store"):
        load_model("base")
    with pytest.raises(RingzeroError, match="differs from the model"):
        save_model(saved, "x", HybridLM(tiny_cfg(), policy("float32")), tiny_cfg(num_hidden_layers=2))
