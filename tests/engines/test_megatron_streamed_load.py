"""A checkpoint streams into the megatron engine a layer at a time: a pipeline stage reads only the shard
files of its own tensors, groups are handed on while the files are still being read (no rank holds the
whole model), the result equals loading the full state dict, and a checkpoint that does not fit is
refused by name before any shard is read."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_kit import random_hybrid, tiny_config, tiny_moe_config  # noqa: E402

from ringzero.engines.megatron.convert import StageLayers, to_megatron  # noqa: E402
from ringzero.engines.megatron.streamed import stage_state  # noqa: E402
from ringzero.errors import RingzeroError  # noqa: E402
from ringzero.model.checkpoint import save_state  # noqa: E402
from ringzero.model.config import PrecisionPolicy  # noqa: E402
from ringzero.store import open_store  # noqa: E402

FP32 = PrecisionPolicy.model_validate("fp32")
SMALL_SHARDS = 8 * 1024  # a few tensors per file: every layer spreads over several files


class ReadLog:
    """The shard files a store reads, in order (wraps its verified reads)."""

    def __init__(self, store):
        self.files: list[str] = []
        right = store._verified

        def verified(name, fname, entry, lister="the manifest"):
            if fname.endswith(".safetensors"):
                self.files.append(fname)
            return right(name, fname, entry, lister)

        store._verified = verified


@pytest.fixture
def saved(tmp_path):
    cfg = tiny_moe_config()
    state = random_hybrid(cfg, FP32).state_dict()
    store = open_store(f"file://{tmp_path}", max_shard_bytes=SMALL_SHARDS)
    uri = save_state(store, "ck", cfg, state)
    return cfg, state, store, uri


def test_the_whole_stage_streams_in_groups_of_one_layer_equal_to_the_state(saved):
    cfg, state, store, uri = saved
    log = ReadLog(store)
    files = store._manifest("ck").shards
    assert len(files) >= 6
    seen, first_yield_after = {}, None
    for group in stage_state(store, uri, cfg, StageLayers(0, cfg.num_hidden_layers)):
        first_yield_after = first_yield_after or len(log.files)
        layers = {k.split(".")[1] for k in group if k.startswith("layers.")}
        assert len(layers) <= 1 and (layers or len(group) == 1), sorted(group)
        assert not set(group) & set(seen)
        seen.update(group)
    assert first_yield_after < len(files)  # handed on while files were still to be read
    assert seen.keys() == state.keys() and all(torch.equal(seen[k], state[k]) for k in state)
    assert log.files == list(files)  # each file read once, in order


def test_a_pipeline_stage_reads_only_the_files_of_its_tensors(saved):
    cfg, state, store, uri = saved
    log = ReadLog(store)
    last = StageLayers(2, 1, has_embedding=False, has_head=True)
    got = {k: v for g in stage_state(store, uri, cfg, last) for k, v in g.items()}
    want = {k for k in state if k.startswith("layers.2.") or k.startswith(("norm.", "lm_head."))}
    assert got.keys() == want
    manifest = store._manifest("ck")
    holding = [
        f
        for f in manifest.shards
        if any(
            t.startswith(("model.layers.2.", "model.norm.", "lm_head.")) for t in manifest.files[f].tensors
        )
    ]
    assert log.files == holding and len(holding) < len(manifest.shards)


def test_streamed_and_full_loads_give_every_rank_the_same_shard(saved):
    cfg, state, store, uri = saved
    for tp in (1, 2):
        for rank in range(tp):
            whole = to_megatron(state, cfg, rank, tp)
            streamed = {}
            for group in stage_state(store, uri, cfg, StageLayers(0, cfg.num_hidden_layers)):
                streamed.update(to_megatron(group, cfg, rank, tp))
            assert streamed.keys() == whole.keys()
            assert all(torch.equal(streamed[k], whole[k]) for k in whole)


def test_a_checkpoint_that_does_not_fit_is_refused_by_name_before_reading(tmp_path):
    cfg = tiny_config()
    state = random_hybrid(cfg, FP32).state_dict()
    store = open_store(f"file://{tmp_path}", max_shard_bytes=SMALL_SHARDS)
    partial = {k: v for k, v in state.items() if k != "layers.1.mlp.down_proj.weight"}
    uri = save_state(store, "partial", cfg, partial)
    log = ReadLog(store)
    with pytest.raises(RingzeroError, match=r"missing tensor model\.layers\.1\.mlp\.down_proj\.weight"):
        list(stage_state(store, uri, cfg, StageLayers(0, cfg.num_hidden_layers)))
    assert log.files == []
    other = tiny_config(q_lora_rank=12)
    with pytest.raises(RingzeroError, match="model config differs"):
        list(stage_state(store, uri, other, StageLayers(0, other.num_hidden_layers)))
