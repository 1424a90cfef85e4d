"""The compiled pipeline's shape: steps, wiring, gate conditions, exit handler and pod settings from
config."""

import re

import pytest
from kfp_kit import GPU_KFP, GPU_PARALLEL, compile_docs, executor_of, micro_config, tasks_by_display_name

from ringzero.errors import RingzeroError

pytestmark = pytest.mark.xdist_group("kfp")

STAGES = {"base": "pretrain", "stage1": "rl", "distill": "distill", "eval": "eval"}
COMPONENT = {"pretrain": "lm", "distill": "lm", "rl": "rl", "eval": "eval"}  # pretrain and distill share one


@pytest.fixture
def gpu_spec(tmp_path):
    config = micro_config(
        tmp_path, gate=["reward/mean >= 0.2"], kfp=GPU_KFP, storage="s3://bucket/runs", parallel=GPU_PARALLEL
    )
    return compile_docs(config, tmp_path / "micro.pipeline.yaml")


def _param(task: dict, name: str) -> dict:
    return task["inputs"]["parameters"][name]


def test_one_step_per_stage_running_its_kind(gpu_spec):
    spec, _ = gpu_spec
    tasks = tasks_by_display_name(spec)
    for name, kind in STAGES.items():
        _, key, task = tasks[name]
        assert task["componentRef"]["name"].startswith(f"comp-{COMPONENT[kind]}-stage")
        assert _param(task, "stage_name")["runtimeValue"]["constant"] == name
    stage_steps = [
        n
        for n, (_, _, t) in tasks.items()
        if re.fullmatch(r"comp-(lm|rl|eval)-stage(-\d+)?", t["componentRef"]["name"])
    ]
    assert sorted(stage_steps) == sorted(STAGES)


def test_checkpoints_flow_from_stage_to_stage(gpu_spec):
    spec, _ = gpu_spec
    tasks = tasks_by_display_name(spec)
    base_key, stage1_key = tasks["base"][1], tasks["stage1"][1]
    stage1 = tasks["stage1"][2]
    for name in ("init_uri", "reference_uri", "base_uri"):  # unset reference = the init, as the local runner
        assert _param(stage1, name)["taskOutputParameter"] == {
            "outputParameterKey": "checkpoint_uri",
            "producerTask": base_key,
        }
    # Inside the gate's condition, upstream outputs arrive as inputs of the condition's DAG.
    distill = tasks["distill"][2]
    assert _param(distill, "init_uri") == {
        "componentInputParameter": f"pipelinechannel--{stage1_key}-checkpoint_uri"
    }
    compare = _param(tasks["eval"][2], "compare_uris")["runtimeValue"]["constant"]
    assert sorted(compare) == ["base", "distill", "stage1"]
    assert compare["base"] == f"{{{{$.inputs.parameters['pipelinechannel--{base_key}-checkpoint_uri']}}}}"


def test_everything_after_a_gate_sits_in_its_condition(gpu_spec):
    spec, _ = gpu_spec
    tasks = tasks_by_display_name(spec)
    gate_dag, gate_key, gate = tasks["stage1-gate"]
    assert (
        gate["inputs"]["parameters"]["summary_json"]["taskOutputParameter"]["producerTask"]
        == tasks["stage1"][1]
    )
    cond_dag, cond_key, cond = tasks["stage1-passed"]
    assert cond_dag == gate_dag  # siblings: the condition reads the gate's output in the same DAG
    assert (
        cond["triggerPolicy"]["condition"]
        == f"inputs.parameter_values['pipelinechannel--{gate_key}-Output'] == true"
    )
    inside = cond["componentRef"]["name"]
    assert tasks["distill"][0] == inside and tasks["eval"][0] == inside
    assert tasks["base"][0] == tasks["stage1"][0] == gate_dag
    # The gate's verdict is a boolean output, compared as such.
    gate_outputs = spec["components"][gate["componentRef"]["name"]]["outputDefinitions"]["parameters"]
    assert gate_outputs["Output"]["parameterType"] == "BOOLEAN"


def test_exit_handler_records_the_final_status(gpu_spec):
    spec, _ = gpu_spec
    tasks = tasks_by_display_name(spec)
    dag, _, final = tasks["final-status"]
    handler_dag, handler_key, handler = tasks["staged-run"]
    assert dag == handler_dag == "root"
    assert final["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert final["inputs"]["parameters"]["status"] == {"taskFinalStatus": {"producerTask": handler_key}}
    assert tasks["base"][0] == handler["componentRef"]["name"]  # the stages run inside the handler


def test_gpu_placement_and_secrets_from_config(gpu_spec):
    spec, platform = gpu_spec
    tasks = tasks_by_display_name(spec)
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # the Secret is mounted as files and the store reads their paths: no credential value in the env
    secret_volume = [
        {
            "secretName": "ringzero-s3",
            "optional": False,
            "mountPath": "/etc/ringzero/s3",
            "secretNameParameter": {"runtimeValue": {"constant": "ringzero-s3"}},
        }
    ]
    file_env = [
        {"name": "RINGZERO_S3_ACCESS_KEY_FILE", "value": "/etc/ringzero/s3/id"},
        {"name": "RINGZERO_S3_SECRET_KEY_FILE", "value": "/etc/ringzero/s3/key"},
    ]
    for name in STAGES:
        label, executor = executor_of(spec, tasks[name][2])
        container = executor["container"]
        assert container["image"] == "registry.example/ringzero:0.1.0"
        res = container["resources"]
        assert (res["accelerator"]["resourceCount"], res["accelerator"]["resourceType"]) == (
            "8",
            "nvidia.com/gpu",
        )
        assert (res["resourceMemoryRequest"], res["resourceMemoryLimit"], res["resourceCpuRequest"]) == (
            "256Gi",
            "256Gi",
            "16",
        )
        assert k8s[label]["nodeSelector"] == {"labels": {"pool": "h200"}}
        assert k8s[label]["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
        assert k8s[label]["secretAsVolume"] == secret_volume and "secretAsEnv" not in k8s[label]
        assert container["env"] == file_env
    final_label, final_exec = executor_of(spec, tasks["final-status"][2])
    assert k8s[final_label] == {"secretAsVolume": secret_volume}  # reads the store, trains nothing
    assert final_exec["container"]["env"] == file_env
    assert "resources" not in final_exec["container"]
    gate_label, _ = executor_of(spec, tasks["stage1-gate"][2])
    assert gate_label not in k8s  # a pure function of the summary: no store, no GPUs


def test_cluster_mode_steps_only_wait_and_need_no_gpus(tmp_path):
    kfp = {"base_image": "registry.example/ringzero:0.1.0", "mode": "cluster", "s3_secret": {"name": "s3"}}
    config = micro_config(tmp_path, gate=["reward/mean >= 0.2"], kfp=kfp, storage="s3://bucket/runs")
    spec, platform = compile_docs(config, tmp_path / "p.yaml")
    tasks = tasks_by_display_name(spec)
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in STAGES:
        label, executor = executor_of(spec, tasks[name][2])
        assert _param(tasks[name][2], "mode")["runtimeValue"]["constant"] == "cluster"
        assert "resources" not in executor["container"]
        assert set(k8s[label]) == {
            "secretAsVolume",
            "fieldPathAsEnv",
        }  # the pod names itself owner of its job
        assert {e["name"]: e["fieldPath"] for e in k8s[label]["fieldPathAsEnv"]} == {
            "RINGZERO_POD_NAME": "metadata.name",
            "RINGZERO_POD_UID": "metadata.uid",
        }


def test_no_kfp_section_means_no_platform_settings(tmp_path):
    spec, platform = compile_docs(micro_config(tmp_path, gate=[]), tmp_path / "p.yaml")
    assert platform == {}
    assert "stage1-passed" not in tasks_by_display_name(spec)  # no gate configured, no condition


def test_init_naming_a_stage_without_checkpoint_is_refused(tmp_path):
    """Refused at load, by the config's one rule, before a pipeline is built."""
    config = micro_config(tmp_path, gate=[], extra_stages=[{"name": "after", "kind": "rl", "init": "eval"}])
    with pytest.raises(RingzeroError, match=r"init: stage 'eval' makes no checkpoint"):
        compile_docs(config, tmp_path / "p.yaml")
