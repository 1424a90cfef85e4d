"""The request fields tests/rollout/test_sglang_pairs.py copies by hand are SGLang's own: each copied
struct's fields exist in the struct of the SGLang version the rollout image is built on, read from that
version's source."""

from __future__ import annotations

import pytest
import test_sglang_pairs as pairs
from sglang_source import IO_STRUCT, SAMPLING_PARAMS, distribution, image_version, struct_fields

COPIES = [
    (IO_STRUCT, "GenerateReqInput", pairs.GENERATE_REQ_INPUT),
    (SAMPLING_PARAMS, "SamplingParams", pairs.SAMPLING_PARAMS),
    (IO_STRUCT, "UpdateWeightFromDiskReqInput", pairs.UPDATE_WEIGHT_FROM_DISK),
    (IO_STRUCT, "InitWeightsUpdateGroupReqInput", pairs.INIT_WEIGHTS_UPDATE_GROUP),
    (IO_STRUCT, "UpdateWeightsFromDistributedReqInput", pairs.UPDATE_WEIGHTS_FROM_DISTRIBUTED),
    (IO_STRUCT, "PauseGenerationReqInput", pairs.PAUSE_GENERATION),
    (IO_STRUCT, "ContinueGenerationReqInput", pairs.CONTINUE_GENERATION),
    (IO_STRUCT, "BeginWeightUpdateReqInput", pairs.BEGIN_WEIGHT_UPDATE),
    (IO_STRUCT, "EndWeightUpdateReqInput", pairs.END_WEIGHT_UPDATE),
]


def test_the_installed_source_is_the_rollout_images_version():
    assert distribution().version == image_version()


@pytest.mark.parametrize(("module", "struct", "copied"), COPIES, ids=[c[1] for c in COPIES])
def test_every_copied_field_is_sglangs(module, struct, copied):
    real = struct_fields(module)
    assert struct in real, f"{module} has no {struct} in sglang {image_version()}"
    unknown = sorted(set(copied) - set(real[struct]))
    assert not unknown, f"{struct}: {unknown} are not fields of sglang {image_version()}'s {struct}"


def test_a_field_sglang_lacks_is_caught():
    real = struct_fields(IO_STRUCT)["InitWeightsUpdateGroupReqInput"]
    assert "rid" in real and "master_port" in real  # BaseReq's rid is inherited
    assert "world_sizes" not in real
