"""The checked-in compiled pipeline of configs/tiny-cpu.yaml matches what the code compiles today."""

import difflib
import json
from pathlib import Path

import pytest
import yaml
from kfp_kit import compile_docs

pytestmark = pytest.mark.xdist_group("kfp")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tiny-cpu.yaml"
GOLDEN = REPO / "pipelines" / "compiled" / "tiny-cpu.yaml"
REGENERATE = "ringzero kfp compile configs/tiny-cpu.yaml --output pipelines/compiled/tiny-cpu.yaml"


def test_compiled_tiny_pipeline_matches_the_checked_in_file(tmp_path):
    out = tmp_path / "tiny-cpu.yaml"
    compile_docs(CONFIG, out)
    # Compared as parsed documents (the spec has no volatile fields: no timestamps, the SDK version is
    # pinned).
    if list(yaml.safe_load_all(out.read_text())) != list(yaml.safe_load_all(GOLDEN.read_text())):
        diff = "".join(
            difflib.unified_diff(
                GOLDEN.read_text().splitlines(keepends=True),
                out.read_text().splitlines(keepends=True),
                "checked in",
                "compiled now",
                n=2,
            )
        )
        pytest.fail(
            f"{GOLDEN.relative_to(REPO)} is stale; if the change is intended, regenerate it with\n"
            f"  {REGENERATE}\n{diff[:6000]}"
        )


# -- the compiled pipeline read against the run config, not against the compiler ---------------------

SHIPPED = sorted((REPO / "configs").glob("*.yaml"))
STAGE_OUTPUTS = {
    "parameters": {
        "checkpoint_uri": {"parameterType": "STRING"},
        "summary_json": {"parameterType": "STRING"},
    },
    "artifacts": {
        name: {"artifactType": {"schemaTitle": title, "schemaVersion": "0.0.1"}}
        for name, title in (
            ("metrics", "system.Metrics"),
            ("report", "system.HTML"),
            ("summary", "system.Markdown"),
        )
    },
}
STAGE_INPUTS = {"init_uri", "base_uri", "mode", "run_config", "run_id", "stage_name"}
KIND_INPUTS = {
    "rl": {"reference_uri"},
    "eval": {"compare_uris"},
    "pretrain": {"stage_kind"},
    "distill": {"stage_kind"},
}
COMPONENT = {
    "pretrain": "lm",
    "distill": "lm",
    "rl": "rl",
    "eval": "eval",
}  # one next-token component for two kinds
MAKES_CHECKPOINT = ("pretrain", "rl", "distill")


def expected_inputs(stages) -> dict[str, dict]:
    """Per stage, the stage each input comes from, by the documented rules (docs: local runner): init is
    the named stage or else the latest earlier stage with a checkpoint; an RL reference is the named stage
    or else the init; the base is the first pretrain stage; compare lists stages by name."""
    out, earlier = {}, []
    for stage in stages:
        made = [s.name for s in earlier if s.kind in MAKES_CHECKPOINT]
        init = stage.init or (made[-1] if made else None)
        wiring = {"init_uri": init, "base_uri": next((s.name for s in earlier if s.kind == "pretrain"), None)}
        if stage.kind == "rl":
            wiring["reference_uri"] = getattr(stage, "reference", None) or init
        out[stage.name] = {"wiring": wiring, "compare": list(getattr(stage, "compare", []))}
        earlier.append(stage)
    return out


class Dags:
    """The compiled spec's DAGs: which DAG holds each task and which task a parameter comes from."""

    def __init__(self, spec):
        self.spec = spec
        self.dags = {"root": spec["root"]["dag"]}
        self.dags.update({n: c["dag"] for n, c in spec["components"].items() if "dag" in c})
        self.where = {key: (dag, task) for dag, d in self.dags.items() for key, task in d["tasks"].items()}
        self.parent = {
            task["componentRef"]["name"]: dag
            for dag, task in self.where.values()
            if task["componentRef"]["name"] in self.dags
        }

    def by_name(self, display: str) -> tuple[str, str, dict]:
        (found,) = [(dag, key, t) for key, (dag, t) in self.where.items() if t["taskInfo"]["name"] == display]
        return found

    def producer(self, dag: str, source: dict) -> tuple[str, str] | None:
        """(producer task display name, output key) of a parameter, followed up through enclosing DAGs."""
        if "taskOutputParameter" in source:
            ref = source["taskOutputParameter"]
            return self.where[ref["producerTask"]][1]["taskInfo"]["name"], ref["outputParameterKey"]
        if "componentInputParameter" in source and dag != "root":
            (holder,) = [t for d, t in self.where.values() if t["componentRef"]["name"] == dag]
            return self.producer(
                self.parent[dag], holder["inputs"]["parameters"][source["componentInputParameter"]]
            )
        return None

    def enclosing(self, dag: str) -> list[str]:
        chain = [dag]
        while chain[-1] in self.parent:
            chain.append(self.parent[chain[-1]])
        return chain


def check_pipeline(spec: dict, cfg, kfp) -> None:
    dags = Dags(spec)
    executors = spec["deploymentSpec"]["executors"]
    expected = expected_inputs(cfg.stages)
    tasks = {s.name: dags.by_name(s.name) for s in cfg.stages}
    stage_tasks = [
        t["taskInfo"]["name"]
        for _, t in dags.where.values()
        if t["componentRef"]["name"].endswith(
            tuple(f"-stage{suffix}" for suffix in ("", *(f"-{i}" for i in range(2, 20))))
        )
    ]
    assert sorted(stage_tasks) == sorted(tasks), "one task per stage of the config, no more"
    root_config = spec["root"]["inputDefinitions"]["parameters"]["run_config"]["defaultValue"]
    assert json.loads(root_config) == cfg.model_dump(mode="json", exclude_unset=True)
    for stage in cfg.stages:
        dag, key, task = tasks[stage.name]
        component = spec["components"][task["componentRef"]["name"]]
        assert task["componentRef"]["name"].startswith(f"comp-{COMPONENT[stage.kind]}-stage"), stage.name
        if stage.kind in ("pretrain", "distill"):  # the shared component is told which kind it runs
            assert task["inputs"]["parameters"]["stage_kind"]["runtimeValue"]["constant"] == stage.kind
        assert task["inputs"]["parameters"]["stage_name"]["runtimeValue"]["constant"] == stage.name
        assert task["inputs"]["parameters"]["mode"]["runtimeValue"]["constant"] == kfp.mode
        # The component's interface: what each stage takes and what it hands on.
        assert set(component["inputDefinitions"]["parameters"]) == STAGE_INPUTS | KIND_INPUTS.get(
            stage.kind, set()
        )
        assert component["outputDefinitions"] == STAGE_OUTPUTS, stage.name
        container = executors[component["executorLabel"]]["container"]
        assert (
            container["args"][container["args"].index("--function_to_execute") + 1]
            == f"{COMPONENT[stage.kind]}_stage"
        )
        assert container["image"] == kfp.base_image
        pod = kfp.stage_pod
        if kfp.mode == "in-process" and (pod.cpu or pod.memory or pod.gpus):
            res = container["resources"]
            assert res.get("resourceCpuRequest") == pod.cpu and res.get("resourceMemoryRequest") == pod.memory
            assert res.get("resourceMemoryLimit") == pod.memory
            if pod.gpus:
                acc = res["accelerator"]
                assert (acc["resourceCount"], acc["resourceType"]) == (str(pod.gpus), pod.accelerator)
        else:
            assert "resources" not in container
        # The DAG edges follow the stage graph: each input comes from the stage the rules name.
        deps = set(task.get("dependentTasks", []))
        for param, source_stage in expected[stage.name]["wiring"].items():
            got = dags.producer(dag, task["inputs"]["parameters"][param])
            want = None if source_stage is None else (source_stage, "checkpoint_uri")
            assert got == want, (stage.name, param, got, want)
        for param, source in task["inputs"]["parameters"].items():  # every upstream output is waited for
            if "taskOutputParameter" in source:
                assert source["taskOutputParameter"]["producerTask"] in deps, (stage.name, param)
        if expected[stage.name]["compare"]:
            compare = task["inputs"]["parameters"]["compare_uris"]["runtimeValue"]["constant"]
            assert sorted(compare) == sorted(expected[stage.name]["compare"])
            for name, ref in compare.items():
                producer_key = tasks[name][1]
                channel = f"pipelinechannel--{producer_key}-checkpoint_uri"
                assert ref == f"{{{{$.inputs.parameters['{channel}']}}}}", (stage.name, name)
                assert dags.producer(dag, task["inputs"]["parameters"][channel]) == (name, "checkpoint_uri")
    # A gate holds back every later stage: they all sit inside its condition.
    order = [s.name for s in cfg.stages]
    for i, stage in enumerate(cfg.stages):
        if not stage.gate:
            continue
        gate_dag, _, gate = dags.by_name(f"{stage.name}-gate")
        assert dags.producer(gate_dag, gate["inputs"]["parameters"]["summary_json"]) == (
            stage.name,
            "summary_json",
        )
        _, _, cond = dags.by_name(f"{stage.name}-passed")
        inside = cond["componentRef"]["name"]
        for later in order[i + 1 :]:
            assert inside in dags.enclosing(tasks[later][0]), (stage.name, later)
        assert inside not in dags.enclosing(tasks[stage.name][0])


def test_the_checked_in_pipeline_wires_every_stage_of_its_config():
    from ringzero.kfp.settings import load_kfp_config

    cfg, kfp = load_kfp_config(CONFIG, None)
    check_pipeline(yaml.safe_load_all(GOLDEN.read_text()).__next__(), cfg, kfp)


@pytest.mark.parametrize("config", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_each_shipped_config_compiles_to_its_stage_graph_image_and_pods(config, tmp_path):
    from ringzero.config import load_config
    from ringzero.kfp.settings import load_kfp_config

    base = load_config(config)
    training = base.engines.training
    ranks = base.parallel.dp * base.parallel.cp * training.tp * training.pp
    overrides = [
        "kfp.base_image=registry.example/ringzero:9.9",
        "kfp.stage_pod.cpu=6500m",
        "kfp.stage_pod.memory=24Gi",
        f"kfp.stage_pod.gpus={ranks}",
    ]
    spec, _ = compile_docs(config, tmp_path / "p.yaml", overrides)
    cfg, kfp = load_kfp_config(config, overrides)
    assert (kfp.base_image, kfp.stage_pod.cpu, kfp.stage_pod.memory, kfp.stage_pod.gpus) == (
        "registry.example/ringzero:9.9",
        "6500m",
        "24Gi",
        ranks,
    )
    check_pipeline(spec, cfg, kfp)
