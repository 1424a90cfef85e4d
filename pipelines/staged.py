"""Build the staged pipeline from a run config: one step per stage in config order, gated, with an exit
handler.

Shape, for the tiny config::

    exit handler (record final status)
      base -> stage1 -> stage1-gate
        if stage1-gate passed:
          distill -> stage2 -> tier -> eval

A stage's input checkpoint is the named stage's output, a URI, or (unset) the last checkpoint made
before it, exactly as the local runner resolves them, so both runners compute the same inputs.
"""

import contextlib  # no "from __future__ import annotations": KFP reads the pipeline's annotations as types

from kfp import dsl

from components import Components, make_components
from pipelines.pod import apply_pod_settings
from ringzero.config.kfp import KfpSettings
from ringzero.config.run import MAKES_CHECKPOINT, RunConfig, stage_input_refs
from ringzero.errors import RingzeroError
from ringzero.kfp.tasks import config_text

# Stage kinds whose step outputs a checkpoint (eval only reads them).


def build_pipeline(cfg: RunConfig, settings: KfpSettings):
    """The pipeline (a KFP graph component); its one parameter, run_config, is the run config as JSON text."""
    if not cfg.stages:
        raise RingzeroError(f"run {cfg.run.name!r} has no stages: there is no pipeline to build")
    comps = make_components(settings.base_image)
    chain = " -> ".join(f"{s.name} ({s.kind})" for s in cfg.stages)

    @dsl.pipeline(name=cfg.run.name, description=f"ringzero staged run: {chain}")
    def staged_run(run_config: str = config_text(cfg)):
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        final = comps.record_status(run_config=run_config, run_id=run_id).set_display_name("final-status")
        apply_pod_settings(final, settings, runs_stage=False, uses_store=True)
        with dsl.ExitHandler(final, name="staged-run"):
            _add_stages(cfg, settings, comps, run_config, run_id)

    return staged_run


def _add_stages(cfg: RunConfig, settings: KfpSettings, comps: Components, run_config, run_id) -> None:
    made: list[tuple[str, str, object]] = []  # (name, kind, checkpoint_uri output) of earlier stages
    with contextlib.ExitStack() as gates_passed:
        for i, stage in enumerate(cfg.stages):
            args = {
                "run_config": run_config,
                "stage_name": stage.name,
                "mode": settings.mode,
                "run_id": run_id,
            }
            refs = stage_input_refs(stage, made)
            args.update(init_uri=refs.init or "", base_uri=refs.base or "")
            if stage.kind in ("pretrain", "distill"):
                args["stage_kind"] = stage.kind  # one component runs both (components.stages.lm_stage)
            if stage.kind == "rl":
                args["reference_uri"] = refs.reference or ""
            if stage.kind == "eval":
                args["compare_uris"] = refs.compare
            task = comps.stages[stage.kind](**args).set_display_name(stage.name)
            apply_pod_settings(task, settings, runs_stage=True, uses_store=True)
            if stage.kind in MAKES_CHECKPOINT:
                made.append((stage.name, stage.kind, task.outputs["checkpoint_uri"]))
            if stage.gate:
                verdict = comps.gate(
                    run_config=run_config, stage_name=stage.name, summary_json=task.outputs["summary_json"]
                ).set_display_name(f"{stage.name}-gate")
                apply_pod_settings(verdict, settings, runs_stage=False, uses_store=False)
                if i + 1 < len(cfg.stages):
                    # Everything after a gate sits inside its condition: a failed gate runs nothing
                    # downstream.
                    passed = verdict.outputs["Output"] == True  # noqa: E712 - a KFP condition, not a bool
                    gates_passed.enter_context(dsl.If(passed, name=f"{stage.name}-passed"))
