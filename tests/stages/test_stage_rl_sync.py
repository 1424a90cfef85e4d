"""Weight pushes: in process under the engine's own precision, or through the store for an HTTP server."""

import torch
from stage_kit import micro_model, state_equal

from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.rl.sync import push_weights
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
    assert push_weights(engine, trainer_model.state_dict(), "step-3") is None
    served = engine.model.state_dict()
    assert engine.weight_version == "step-3"
    assert all(v.dtype == torch.bfloat16 for k, v in served.items() if v.is_floating_point())
    expected = {k: v.to(torch.bfloat16) for k, v in trainer_model.state_dict().items()}
    assert state_equal(served, expected)


def test_disk_push_commits_a_loadable_checkpoint_once_per_version(tmp_path):
    store = open_store(f"file://{tmp_path}")
    model, client = micro_model(), DiskOnlyClient()
    uri = push_weights(client, model.state_dict(), "step-7", store=store, prefix="stages/x", model_cfg=model.cfg)
    assert client.calls == [(uri, "step-7")] and uri.endswith("stages/x/weights-step-7")
    assert state_equal(load_model(uri, PrecisionPolicy.preset("fp32")).model.state_dict(), model.state_dict())
    # A resumed stage pushes the same step again: the committed weights are reused, not rewritten.
    again = push_weights(client, model.state_dict(), "step-7", store=store, prefix="stages/x", model_cfg=model.cfg)
    assert again == uri and client.calls[-1] == (uri, "step-7")
