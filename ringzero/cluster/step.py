"""A pipeline step in cluster mode: run the stage as a training job, then read its outcome from the store.

The job runs ``ringzero stage run`` with the same config, stage and inputs, so it commits its outcome
under the same stage identity; the step then calls ``execute_stage``, which finds that committed outcome
and returns it without running anything. A stage already committed is never launched.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import yaml

from ringzero.cluster.job import StageJob, stage_args
from ringzero.cluster.labels import launch_name
from ringzero.cluster.launch import launch_stage
from ringzero.cluster.rollout import RolloutSpec
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.pipeline.execute import ExecutedStage, execute_stage, outcome_key
from ringzero.pipeline.identity import stage_hash

SAMPLING_KINDS = ("rl", "distill", "eval")  # stages that generate with the rollout engine


def rollout_for(cfg, settings: ClusterSettings, stage, inputs) -> RolloutSpec | None:
    """SGLang servers for sampling stages of runs whose rollout engine is sglang, serving the input policy."""
    if cfg.engines.rollout.kind != "sglang" or stage.kind not in SAMPLING_KINDS:
        return None
    if not inputs.init_uri:
        raise RingzeroError(f"stage {stage.name!r} samples with SGLang but has no input checkpoint to serve")
    return RolloutSpec.from_run_config(cfg, inputs.init_uri, stage)


def execute_stage_on_cluster(
    cfg,
    store,
    stage,
    inputs,
    run_dir: Path,
    *,
    settings: ClusterSettings | None = None,
    api=None,
    environ=os.environ,
    clock=None,
) -> ExecutedStage:
    settings = settings or getattr(cfg, "cluster", None)
    if settings is None:
        raise RingzeroError(
            "cluster mode needs cluster settings (the run config's `cluster:` section, "
            "which the Helm chart's pipeline upload fills in)"
        )
    key = outcome_key(stage_hash(cfg, stage, inputs))
    if store.get_json(key) is None:
        if api is None:
            from ringzero.cluster.kube import KubernetesApi

            api = KubernetesApi()
        from ringzero.cluster.kube import current_namespace, owner_from_env

        step = environ.get("RINGZERO_POD_NAME") or uuid.uuid4().hex
        job = StageJob(
            run=cfg.run.name,
            stage=stage.name,
            name=launch_name(cfg.run.name, stage.name, step),
            namespace=settings.namespace or current_namespace(),
            config_yaml=yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False),
            dp=cfg.parallel.dp,
            cp=cfg.parallel.cp,
            tp=cfg.engines.training.tp,
            pp=cfg.engines.training.pp,
            stage_args=stage_args(inputs),
            owner=owner_from_env(environ),
        )
        extra = {"clock": clock} if clock else {}
        launch_stage(api, settings, job, rollout_for(cfg, settings, stage, inputs), **extra)
        if store.get_json(key) is None:
            # Checked before execute_stage, which would otherwise run the stage here, in the step's pod.
            raise RingzeroError(
                f"stage {stage.name!r}: the cluster job succeeded but committed no outcome "
                f"({key}); does the job use the same store as the pipeline?"
            )
    return execute_stage(cfg, store, stage, inputs, run_dir)
