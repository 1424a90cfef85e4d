"""Weight updates: in memory and from a committed checkpoint, with refusals that name the problem."""

from __future__ import annotations

import pytest
import torch
from rollout_kit import policy, prompts, requests, tiny_model

from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import save_model
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.store import open_store

BATCH = requests(prompts([5, 8]), max_new_tokens=12, temperature=0)


def _ids(engine):
    return [c.output_ids for (c,) in engine.generate(BATCH)]


def test_update_weights_changes_outputs_and_version():
    old, new = tiny_model("float32", seed=0), tiny_model("float32", seed=1)
    engine = EmbeddedEngine(old, policy=policy("fp32-islands"), weight_version="0")
    before = _ids(engine)
    engine.update_weights(new.state_dict(), "1")
    after = engine.generate(BATCH)
    assert [c.output_ids for (c,) in after] != before
    assert [c.output_ids for (c,) in after] == _ids(EmbeddedEngine(new, policy=policy("fp32-islands")))
    assert {c.weight_version for (c,) in after} == {"1"}
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}  # cast to the engine's policy
    engine.update_weights(old.state_dict(), "2")
    assert _ids(engine) == before


def test_update_weights_refuses_a_mismatch():
    engine = EmbeddedEngine(tiny_model("float32"))
    bad = dict(tiny_model("float32").state_dict())
    bad["embed.weight"] = torch.zeros(3, 3)
    with pytest.raises(RingzeroError, match="embed.weight"):
        engine.update_weights(bad, "1")
    assert engine.weight_version == "0"


def test_update_weights_from_disk(tmp_path):
    store = open_store(f"file://{tmp_path}/store")
    new = tiny_model("float32", seed=1)
    uri = save_model(store, "step-1", new)
    engine = EmbeddedEngine(tiny_model("float32", seed=0), policy=policy("float32"))
    engine.update_weights_from_disk(uri, "step-1")
    assert _ids(engine) == _ids(EmbeddedEngine(new, policy=policy("float32")))
    assert engine.weight_version == "step-1"

    other = save_model(store, "wider", tiny_model("float32", hidden_size=40))
    with pytest.raises(RingzeroError, match="config differs"):
        engine.update_weights_from_disk(other, "x")
    assert engine.weight_version == "step-1"


def test_update_weights_from_a_local_model_folder_as_sglang_takes_model_path(tmp_path):
    from ringzero.model.hf_folder import write_folder

    old, new = tiny_model("float32", seed=0), tiny_model("float32", seed=1)
    write_folder(tmp_path / "step-2", new.cfg, new.state_dict())
    engine = EmbeddedEngine(old, policy=policy("fp32"))
    engine.update_weights_from_disk(str(tmp_path / "step-2"), "2")
    assert _ids(engine) == _ids(EmbeddedEngine(new, policy=policy("fp32"))) and engine.weight_version == "2"
    with pytest.raises(RingzeroError, match="no config.json"):
        engine.update_weights_from_disk(str(tmp_path), "3")
