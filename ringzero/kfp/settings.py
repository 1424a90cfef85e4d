"""Typed settings of the Kubeflow pipeline: the step image, where stages execute, and their pods.

A run config may carry these under a top-level ``kfp:`` section. Until ``RunConfig`` has that field,
``load_kfp_config`` takes the section off the YAML before the rest is validated as usual.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ringzero.config.base import StrictModel
from ringzero.config.loader import apply_overrides, parse_config, read_yaml
from ringzero.config.run import RunConfig
from ringzero.errors import ConfigError

# The quantities the KFP SDK accepts for task resources (it raises a bare ValueError otherwise).
_CPU = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
_MEMORY = re.compile(r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Toleration(StrictModel):
    key: str | None = Field(None, description="taint key; null with operator Exists tolerates every taint")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = Field(None, description="taint value; must be empty with operator Exists")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @model_validator(mode="after")
    def _value_with_equal(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value must be empty when operator is Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without key needs operator Exists")
        return self


class StagePod(StrictModel):
    """The pod of a step that runs its stage in-process: resources and node placement."""

    cpu: str | None = Field(None, description="CPU request, e.g. '4' or '500m'; null = the cluster default")
    memory: str | None = Field(None, description="memory request and limit, e.g. '16Gi'; null = the cluster default")
    gpus: int = Field(0, ge=0, description="GPUs requested (and limited to)")
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


class S3Secret(StrictModel):
    """A Kubernetes Secret holding the store's S3 keys; steps get them as ``RINGZERO_S3_*`` variables."""

    name: str = Field(..., description="Secret name in the pipeline's namespace")
    access_key_key: str = Field("access-key", description="data key of the access key id")
    secret_key_key: str = Field("secret-key", description="data key of the secret access key")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _K8S_NAME.match(v) or len(v) > 253:
            raise ValueError(f"must be a Kubernetes object name (got {v!r})")
        return v


class KfpSettings(StrictModel):
    base_image: str = Field(
        "ringzero:0.1.0", min_length=1, description="image of every step; it must have ringzero with its kfp extra"
    )
    mode: Literal["in-process", "cluster"] = Field(
        "in-process",
        description="in-process: a step runs its stage in its own pod; cluster: a step launches the stage as a "
        "training job (cluster settings) and waits for it",
    )
    s3_secret: S3Secret | None = Field(None, description="credentials of an s3:// store; null = none mounted")
    stage_pod: StagePod = Field(StagePod(), description="pods of in-process stage steps")

    @model_validator(mode="after")
    def _stage_pod_only_in_process(self) -> KfpSettings:
        if self.mode == "cluster" and self.stage_pod != StagePod():
            raise ValueError(
                "stage_pod: applies to mode in-process only; in cluster mode the training job's pods are set "
                "in the cluster settings and the step itself only waits"
            )
        return self


def load_kfp_config(path: str | Path, overrides: list[str] | None = None) -> tuple[RunConfig, KfpSettings]:
    """``load_config`` that also reads the ``kfp:`` section (overrides may address it: ``kfp.mode=cluster``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["no such file"])
    data = read_yaml(path.read_text(), str(path))
    apply_overrides(data, list(overrides or []))
    section = data.pop("kfp", None) or {}
    problems = []
    try:
        settings = KfpSettings.model_validate(section)
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
    try:
        cfg = parse_config(data, str(path))
    except ConfigError as exc:
        raise ConfigError(str(path), exc.problems + problems) from None
    if problems:
        raise ConfigError(str(path), problems)
    return cfg, settings


def _describe(err: dict) -> str:
    where = "kfp" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{where}: {msg}"
