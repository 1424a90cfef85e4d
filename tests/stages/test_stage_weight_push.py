"""Weight pushes: one transport chosen from engines.rollout; in process under the engine's own precision, a
folder on the shared volume, or a checkpoint through the store for an HTTP server."""

from pathlib import Path

import pytest
import torch
from stage_kit import micro_model, state_equal

from ringzero.config.loader import load_config
from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hf_folder import load_folder
from ringzero.rollout.deployment.weight_push import WeightPusher, push_mode
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.store import open_store


class DiskOnlyClient:
    """What the RL step sees of an SGLang-compatible server: no in-process update, only from disk."""

    def __init__(self):
        self.calls = []

    def update_weights_from_disk(self, uri, weight_version):
        self.calls.append((uri, weight_version))


def test_in_process_push_casts_to_the_engines_own_policy():
    trainer_model = micro_model("fp32")
    engine = EmbeddedEngine(micro_model("fp32", seed=1), None, PrecisionPolicy.preset("bf16"))
    assert WeightPusher("in_process").push(engine, trainer_model.state_dict(), "step-3") is None
    served = engine.model.state_dict()
    assert engine.weight_version == "step-3"
    assert all(v.dtype == torch.bfloat16 for k, v in served.items() if v.is_floating_point())
    expected = {k: v.to(torch.bfloat16) for k, v in trainer_model.state_dict().items()}
    assert state_equal(served, expected)


def test_disk_push_commits_a_loadable_checkpoint_once_per_version(tmp_path):
    store = open_store(f"file://{tmp_path}")
    model, client = micro_model(), DiskOnlyClient()
    pusher = WeightPusher("store", store=store, prefix="stages/x", model_cfg=model.cfg)
    uri = pusher.push(client, model.state_dict(), "step-7")
    assert client.calls == [(uri, "step-7")] and uri.endswith("stages/x/weights-step-7")
    assert state_equal(load_model(uri, PrecisionPolicy.preset("fp32")).model.state_dict(), model.state_dict())
    # A resumed stage pushes the same step again: the committed weights are reused, not rewritten.
    again = pusher.push(client, model.state_dict(), "step-7")
    assert again == uri and client.calls[-1] == (uri, "step-7")


def tiny(*overrides):
    return load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml", list(overrides))


SGLANG = ["engines.rollout.kind=sglang", "engines.rollout.endpoint=http://x:1"]


@pytest.mark.parametrize(
    "overrides, mode",
    [
        ([], "in_process"),
        ([*SGLANG, "engines.rollout.weight_sync=distributed"], "distributed"),
        ([*SGLANG, "engines.rollout.weights_dir=/w"], "disk"),
        ([*SGLANG, "engines.rollout.weight_sync=store"], "store"),
    ],
)
def test_the_transport_is_the_one_engines_rollout_names(overrides, mode):
    rollout = tiny(*overrides).engines.rollout
    assert push_mode(rollout) == mode
    assert WeightPusher.for_rollout(rollout, model_cfg=micro_model().cfg).mode == mode
    assert WeightPusher.for_rollout(rollout, local=True).mode == "in_process"


def test_a_disk_push_without_a_shared_volume_is_refused_before_any_step():
    with pytest.raises(RingzeroError, match="weight_sync disk needs engines.rollout.weights_dir"):
        WeightPusher.for_rollout(tiny(*SGLANG).engines.rollout, model_cfg=micro_model().cfg)


def test_a_tensor_push_to_a_client_that_takes_no_tensors_is_refused_by_name():
    with pytest.raises(
        RingzeroError,
        match="distributed weight push needs a rollout client that takes tensors "
        r"\(DiskOnlyClient",
    ):
        WeightPusher("distributed").push(DiskOnlyClient(), {}, "step-1")


def test_a_disk_push_writes_the_folder_the_servers_load(tmp_path):
    model, client = micro_model(), DiskOnlyClient()
    path = WeightPusher("disk", model_cfg=model.cfg, weights_dir=str(tmp_path)).push(
        client, model.state_dict(), "step-2", dtype=torch.bfloat16
    )
    assert client.calls == [(path, "step-2")] and path == str(tmp_path / "weights-step-2")
    served = load_folder(path, PrecisionPolicy.preset("fp32")).model.state_dict()
    assert state_equal(served, {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})


def test_a_store_push_of_a_committed_checkpoint_names_it_and_writes_nothing(tmp_path):
    client = DiskOnlyClient()
    assert WeightPusher("store").push(client, {}, "s3://b/ckpt", committed_uri="s3://b/ckpt") == "s3://b/ckpt"
    assert client.calls == [("s3://b/ckpt", "s3://b/ckpt")]
