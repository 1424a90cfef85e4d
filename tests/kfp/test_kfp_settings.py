"""KfpSettings validation and the ``kfp:`` section of a run config."""

import pytest
from kfp_kit import GPU_KFP, GPU_PARALLEL, micro_config
from pydantic import ValidationError

from ringzero.config.kfp import KfpSettings
from ringzero.errors import ConfigError
from ringzero.kfp.settings import load_kfp_config

pytestmark = pytest.mark.xdist_group("kfp")


def test_gpu_settings_are_refused_in_cluster_mode():
    with pytest.raises(ValidationError, match="stage_pod: applies to mode in-process only"):
        KfpSettings(mode="cluster", stage_pod={"gpus": 8})
    assert KfpSettings(mode="cluster").stage_pod.gpus == 0


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"memory": "16GB"}, "memory"),
        ({"cpu": "four"}, "cpu"),
        ({"gpus": -1}, "gpus"),
        ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations"),
    ],
)
def test_bad_pod_settings_name_their_field(pod, field):
    with pytest.raises(ValidationError) as info:
        KfpSettings(stage_pod=pod)
    assert info.value.errors()[0]["loc"][:2] == ("stage_pod", field)


def test_kfp_section_is_read_next_to_the_run_config(tmp_path):
    cfg, settings = load_kfp_config(micro_config(tmp_path, gate=[], kfp=GPU_KFP, parallel=GPU_PARALLEL))
    assert cfg.run.name == "micro" and [s.name for s in cfg.stages] == ["base", "stage1", "distill", "eval"]
    assert settings.stage_pod.gpus == 8 and settings.s3_secret.name == "ringzero-s3"


def test_overrides_reach_the_kfp_section(tmp_path):
    _, settings = load_kfp_config(
        micro_config(tmp_path, gate=[]), ["kfp.mode=cluster", "kfp.base_image=img:1"]
    )
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


@pytest.mark.parametrize(
    ("gpus", "parallel", "fragment"),
    [
        (
            8,
            None,
            "kfp.stage_pod.gpus: 8 GPUs run the stage with 8 local ranks, but parallel.dp x parallel.cp = "
            "1 x 1 = 1",
        ),
        (
            4,
            {"dp": 2, "cp": 4},
            "4 GPUs run the stage with 4 local ranks, but parallel.dp x parallel.cp = 2 x 4 = 8",
        ),
        (
            0,
            {"dp": 2},
            "kfp.stage_pod.gpus: 0 runs the stage as 1 process, but parallel.dp x parallel.cp = 2 x 1 = 2",
        ),
        (1, {"cp": 2}, "1 GPUs run the stage with 1 local ranks, but parallel.dp x parallel.cp = 1 x 2 = 2"),
    ],
)
def test_in_process_steps_must_run_dp_times_cp_ranks(tmp_path, gpus, parallel, fragment):
    config = micro_config(tmp_path, gate=[], kfp={"stage_pod": {"gpus": gpus}}, parallel=parallel)
    with pytest.raises(ConfigError) as info:
        load_kfp_config(config)
    assert len(info.value.problems) == 1 and fragment in info.value.problems[0]


@pytest.mark.parametrize(
    ("gpus", "parallel"), [(0, None), (1, None), (2, {"dp": 2}), (8, {"dp": 2, "cp": 4})]
)
def test_in_process_steps_with_one_rank_per_gpu_load(tmp_path, gpus, parallel):
    cfg, settings = load_kfp_config(
        micro_config(tmp_path, gate=[], kfp={"stage_pod": {"gpus": gpus}}, parallel=parallel)
    )
    assert settings.stage_pod.local_ranks() == cfg.parallel.dp * cfg.parallel.cp == max(gpus, 1)


def test_cluster_mode_steps_leave_the_ranks_to_the_launcher(tmp_path):
    # The step only waits; the launcher checks the job's nodes x GPUs against dp x cp.
    cfg, _ = load_kfp_config(
        micro_config(tmp_path, gate=[], kfp={"mode": "cluster"}, parallel={"dp": 2, "cp": 4})
    )
    assert cfg.parallel.dp * cfg.parallel.cp == 8
