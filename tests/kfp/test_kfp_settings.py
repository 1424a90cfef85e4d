"""KfpSettings validation and the ``kfp:`` section of a run config."""

import pytest
from kfp_kit import GPU_KFP, micro_config
from pydantic import ValidationError

from ringzero.errors import ConfigError
from ringzero.kfp.settings import KfpSettings, load_kfp_config

pytestmark = pytest.mark.xdist_group("kfp")


def test_gpu_settings_are_refused_in_cluster_mode():
    with pytest.raises(ValidationError, match="stage_pod: applies to mode in-process only"):
        KfpSettings(mode="cluster", stage_pod={"gpus": 8})
    assert KfpSettings(mode="cluster").stage_pod.gpus == 0


@pytest.mark.parametrize(("pod", "field"), [
    ({"memory": "16GB"}, "memory"),
    ({"cpu": "four"}, "cpu"),
    ({"gpus": -1}, "gpus"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations"),
])
def test_bad_pod_settings_name_their_field(pod, field):
    with pytest.raises(ValidationError) as info:
        KfpSettings(stage_pod=pod)
    assert info.value.errors()[0]["loc"][:2] == ("stage_pod", field)


def test_kfp_section_is_read_next_to_the_run_config(tmp_path):
    cfg, settings = load_kfp_config(micro_config(tmp_path, gate=[], kfp=GPU_KFP))
    assert cfg.run.name == "micro" and [s.name for s in cfg.stages] == ["base", "stage1", "distill", "eval"]
    assert settings.stage_pod.gpus == 8 and settings.s3_secret.name == "ringzero-s3"


def test_overrides_reach_the_kfp_section(tmp_path):
    _, settings = load_kfp_config(micro_config(tmp_path, gate=[]), ["kfp.mode=cluster", "kfp.base_image=img:1"])
    assert (settings.mode, settings.base_image) == ("cluster", "img:1")


def test_problems_of_both_sections_are_reported_at_once(tmp_path):
    config = micro_config(tmp_path, gate=[], kfp={"stage_pod": {"gpu": 1}})
    with pytest.raises(ConfigError) as info:
        load_kfp_config(config, ["stages.base.steps=0"])
    assert any(p.startswith("kfp.stage_pod.gpu: unknown key") for p in info.value.problems)
    assert any(p.startswith("stages[0].steps") for p in info.value.problems)


def test_a_config_without_kfp_section_gets_the_defaults(tmp_path):
    _, settings = load_kfp_config(micro_config(tmp_path, gate=[]))
    assert settings == KfpSettings()


def test_a_whole_section_problem_names_the_field_it_is_about(tmp_path):
    config = micro_config(tmp_path, gate=[], kfp={"mode": "cluster", "stage_pod": {"gpus": 1}})
    with pytest.raises(ConfigError) as info:
        load_kfp_config(config)
    assert info.value.problems == [
        "kfp.stage_pod: applies to mode in-process only; in cluster mode the training job's pods are set in "
        "the cluster settings and the step itself only waits"
    ]
