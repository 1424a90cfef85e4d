"""Typed settings of the Kubeflow pipeline: the step image, where stages execute, and their pods.

A run config carries these under its top-level ``kfp:`` section (``RunConfig.kfp``). Pure models: the
code each step runs, and ``load_kfp_config``, live in ``ringzero.kfp``, above the config layer.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ringzero.config.cluster import S3SecretRef, Toleration
from ringzero.parallel.config import world_product
from ringzero.strict_model import StrictModel

# The quantities the KFP SDK accepts for task resources (it raises a bare ValueError otherwise).
_CPU = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
_MEMORY = re.compile(r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")


class StagePod(StrictModel):
    """The pod of a step that runs its stage in-process: resources and node placement."""

    cpu: str | None = Field(None, description="CPU request, e.g. '4' or '500m'; null = the cluster default")
    memory: str | None = Field(
        None, description="memory request and limit, e.g. '16Gi'; null = the cluster default"
    )
    gpus: int = Field(
        0,
        ge=0,
        description="GPUs requested (and limited to); the stage runs with one local rank per GPU "
        "(torchrun), so parallel.dp x parallel.cp must equal max(gpus, 1)",
    )
    accelerator: str = Field("nvidia.com/gpu", description="extended resource name of the GPUs")
    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels the pod requires")
    tolerations: list[Toleration] = Field(default_factory=list, description="taints the pod tolerates")

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, v: str | None) -> str | None:
        if v is not None and not _CPU.match(v):
            raise ValueError(f"must be a CPU quantity such as '4', '0.5' or '500m' (got {v!r})")
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None and not _MEMORY.match(v):
            raise ValueError(f"must be a memory quantity such as '16Gi' or '512M' (got {v!r})")
        return v

    def local_ranks(self) -> int:
        """Processes the step runs its stage with: one per GPU, or one on a CPU pod."""
        return max(self.gpus, 1)


class KfpSettings(StrictModel):
    base_image: str = Field(
        "ringzero:0.1.0",
        min_length=1,
        description="image of every step; it must have ringzero with its kfp extra",
    )
    mode: Literal["in-process", "cluster"] = Field(
        "in-process",
        description="in-process: a step runs its stage in its own pod; cluster: a step launches the stage as "
        "a "
        "training job (cluster settings) and waits for it",
    )
    s3_secret: S3SecretRef | None = Field(
        None,
        description="Secret with the s3:// store's keys, given to steps as RINGZERO_S3_*; null = none "
        "mounted",
    )
    stage_pod: StagePod = Field(StagePod(), description="pods of in-process stage steps")
    service_account: str | None = Field(
        None,
        description="service account of the run's pods (a submitted run is created with it); in cluster "
        "mode the release's launcher account, which may create the stage jobs; null = the KFP default",
    )

    @field_validator("service_account")
    @classmethod
    def _account(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", v):
            raise ValueError(f"must be a Kubernetes service account name (got {v!r})")
        return v

    @model_validator(mode="after")
    def _stage_pod_only_in_process(self) -> KfpSettings:
        if self.mode == "cluster" and self.stage_pod != StagePod():
            raise ValueError(
                "stage_pod: applies to mode in-process only; in cluster mode the training job's pods are set "
                "in the cluster settings and the step itself only waits"
            )
        return self


def stage_pod_rank_problem(pod: StagePod, dp: int, cp: int, tp: int = 1, pp: int = 1) -> str | None:
    """Why an in-process step with this pod could not run the run's ranks (None when it can).

    An in-process step runs its stage with ``pod.local_ranks()`` processes, one per GPU its pod
    requests; the run's ``parallel.dp x parallel.cp`` (x ``engines.training.tp`` x ``pp``) ranks must be
    exactly those.
    """
    ranks = pod.local_ranks()
    names, values, need = world_product(dp, cp, tp, pp)
    if ranks == need:
        return None
    what = (
        f"{pod.gpus} GPUs run the stage with {ranks} local ranks"
        if pod.gpus
        else "0 runs the stage as 1 process"
    )
    return (
        f"kfp.stage_pod.gpus: {what}, but {names} = {values} = {need}; "
        f"make kfp.stage_pod.gpus equal {names} (or use kfp.mode cluster)"
    )
