"""Helpers of the pipeline tests: write micro run configs, compile them, and look inside the compiled spec."""

from pathlib import Path

import yaml

from ringzero.cli.kfp_cmd import pipelines_module

PLUGINS = Path(__file__).parent / "plugins"  # fake_stage_runners: put on sys.path and PYTHONPATH by a fixture

# An in-process step runs one rank per GPU of its pod: the micro config runs dp x cp = 8 ranks with it.
GPU_PARALLEL = {"dp": 2, "cp": 4}
GPU_KFP = {
    "base_image": "registry.example/ringzero:0.1.0",
    "s3_secret": {"name": "ringzero-s3", "access_key_key": "id", "secret_key_key": "key"},
    "stage_pod": {
        "cpu": "16",
        "memory": "256Gi",
        "gpus": 8,
        "node_selector": {"pool": "h200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def micro_config(
    root: Path,
    *,
    gate: list[str],
    rl_steps: int = 2,
    kfp: dict | None = None,
    storage: str | None = None,
    extra_stages: list[dict] | None = None,
    parallel: dict | None = None,
) -> Path:
    """base (pretrain) -> stage1 (rl, gated) -> distill -> eval (compares all three); returns its path."""
    data = {
        "run": {"name": "micro", "run_dir": str(root / "run")},
        "storage": {"root": storage or f"file://{root / 'store'}"},
        "stages": [
            {"name": "base", "kind": "pretrain", "steps": 1},
            {
                "name": "stage1",
                "kind": "rl",
                "steps": rl_steps,
                "prompts_per_step": 1,
                "samples_per_prompt": 2,
                "minibatches": 1,
                "gate": gate,
            },
            {"name": "distill", "kind": "distill", "prompts": 2},
            {"name": "eval", "kind": "eval", "prompts": 2, "compare": ["base", "stage1", "distill"]},
            *(extra_stages or []),
        ],
    }
    if kfp is not None:
        data["kfp"] = kfp
    if parallel is not None:
        data["parallel"] = parallel
    path = root / "micro.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def compile_docs(config: Path, out: Path, overrides: list[str] | None = None) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of the compiled config; the platform spec is {} when there is none."""
    from ringzero.kfp.settings import load_kfp_config

    cfg, settings = load_kfp_config(config, overrides)
    pipelines_module("runner").compile_pipeline(cfg, settings, out)
    docs = list(yaml.safe_load_all(out.read_text()))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def tasks_by_display_name(spec: dict) -> dict[str, tuple[str, str, dict]]:
    """display name -> (enclosing DAG: "root" or a component name, task key, task), over every DAG."""
    dags = {"root": spec["root"]["dag"]}
    dags.update({name: comp["dag"] for name, comp in spec["components"].items() if "dag" in comp})
    found = {}
    for dag_name, dag in dags.items():
        for key, task in dag["tasks"].items():
            found[task["taskInfo"]["name"]] = (dag_name, key, task)
    return found


def executor_of(spec: dict, task: dict) -> tuple[str, dict]:
    """(executor label, executor) running ``task``."""
    label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
    return label, spec["deploymentSpec"]["executors"][label]
