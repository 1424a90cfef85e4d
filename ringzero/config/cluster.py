"""Typed settings of cluster mode: where a stage's job and its rollout servers run and with what.

The Helm chart renders these settings (``cluster.yaml`` in its run-config ConfigMap) from its values,
so the chart and the launcher read one source. Nothing here holds a credential: the S3 keys stay in a
Kubernetes Secret that pods reference by name. Pure models: the renderers and the client that use them
live in ``ringzero.cluster``, above the config layer.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ringzero.strict_model import StrictModel

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _dns_label(v: str, what: str) -> str:
    if not _DNS_LABEL.match(v) or len(v) > 63:
        raise ValueError(f"{what} must be a DNS label: 1-63 lowercase letters, digits and '-' (got {v!r})")
    return v


class ImageRef(StrictModel):
    """A container image pinned by tag or digest; a moving ``latest`` tag would make runs unreproducible."""

    repository: str = Field(..., min_length=1, description="registry/path of the image, without tag")
    tag: str = Field(..., min_length=1, description="immutable tag (a release) or sha256:... digest")
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        "IfNotPresent", description="kubelet pull policy"
    )

    @field_validator("tag")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if v == "latest":
            raise ValueError("'latest' is not a pinned tag; give a release tag or a sha256 digest")
        return v

    @field_validator("repository")
    @classmethod
    def _no_tag_in_repository(cls, v: str) -> str:
        if "@" in v or ":" in v.rsplit("/", 1)[-1]:
            raise ValueError(f"give the tag in 'tag', not in the repository (got {v!r})")
        return v

    def ref(self) -> str:
        sep = "@" if self.tag.startswith("sha256:") else ":"
        return f"{self.repository}{sep}{self.tag}"


class Images(StrictModel):
    trainer: ImageRef = Field(..., description="CUDA PyTorch + megatron-core + ringzero: stage jobs on GPUs")
    rollout: ImageRef = Field(..., description="SGLang + ringzero glue: rollout servers")
    cpu: ImageRef = Field(
        ..., description="ringzero with the embedded engines: stage jobs on CPU-only clusters"
    )


class Toleration(StrictModel):
    key: str | None = Field(None, description="taint key; null with operator Exists tolerates every taint")
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @model_validator(mode="after")
    def _value_with_equal(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value must be empty when operator is Exists")
        return self

    def to_k8s(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class NodeResources(StrictModel):
    """Requests of one job node (one pod); GPUs are set separately because they are also the process count."""

    cpu: str = Field("4", description="CPU request, Kubernetes quantity")
    memory: str = Field("16Gi", description="memory request (and limit), Kubernetes quantity")
    shm: str = Field(
        "16Gi", description="size of /dev/shm (memory-backed): NCCL and dataloaders need more than 64Mi"
    )


class S3SecretRef(StrictModel):
    """An existing Secret with the S3 keys; only its name and key names are ever rendered."""

    name: str = Field(..., description="Secret name in the run namespace")
    access_key_key: str = Field("access-key", description="key of the access key id in the Secret")
    secret_key_key: str = Field("secret-key", description="key of the secret access key in the Secret")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DNS_SUBDOMAIN.match(v) or len(v) > 253:
            raise ValueError(f"must be a Kubernetes object name (got {v!r})")
        return v


class RolloutSettings(StrictModel):
    replicas: int = Field(1, ge=1, description="SGLang server pods behind the rollout Service")
    tp_size: int = Field(1, ge=1, description="tensor-parallel size of each server = GPUs per server pod")
    resources: NodeResources = NodeResources(cpu="8", memory="64Gi", shm="16Gi")
    ready_timeout_s: float = Field(
        1800.0, gt=0, description="wait this long for every server to pass /health"
    )
    weight_sync: Literal["distributed", "disk"] = Field(
        "distributed",
        description="distributed: the trainer broadcasts new weights to every server over "
        "NCCL; disk: every server loads a model folder from the shared weights volume (shared_weights_pvc)",
    )
    shared_weights_pvc: str | None = Field(
        None,
        description="PersistentVolumeClaim (ReadWriteMany) mounted in trainer and server pods for disk "
        "weight sync; its claim must exist in the run namespace",
    )
    shared_weights_mount: str = Field(
        "/shared-weights", description="where trainer and servers mount that volume"
    )

    @field_validator("shared_weights_pvc")
    @classmethod
    def _pvc(cls, v: str | None) -> str | None:
        if v is not None and (not _DNS_SUBDOMAIN.match(v) or len(v) > 253):
            raise ValueError(f"must be a Kubernetes object name (got {v!r})")
        return v

    @field_validator("shared_weights_mount")
    @classmethod
    def _mount(cls, v: str) -> str:
        if not v.startswith("/") or v.rstrip("/") in ("", "/tmp", "/dev/shm", "/models"):
            raise ValueError(f"must be an absolute path of its own, not / or a scratch folder (got {v!r})")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _disk_needs_a_volume(self) -> RolloutSettings:
        if self.weight_sync == "disk" and self.shared_weights_pvc is None:
            raise ValueError(
                "weight_sync disk needs shared_weights_pvc: SGLang loads pushed weights from a local path, "
                "so "
                "trainer and servers must mount one volume; set a ReadWriteMany claim or use weight_sync "
                "distributed"
            )
        return self


class ClusterSettings(StrictModel):
    """Where and how a stage runs on Kubernetes (cluster mode of the pipeline)."""

    namespace: str | None = Field(
        None, description="namespace of the jobs; null = the launcher's own namespace"
    )
    backend: Literal["trainjob", "pytorchjob"] = Field(
        "trainjob", description="trainjob: Kubeflow Trainer v2; pytorchjob: Training Operator v1 (fallback)"
    )
    runtime: str = Field("torch-distributed", description="ClusterTrainingRuntime a TrainJob references")
    images: Images
    device: Literal["gpu", "cpu"] = Field(
        "gpu", description="gpu: trainer image + GPUs; cpu: cpu image, no GPUs"
    )
    num_nodes: int = Field(1, ge=1, description="job nodes (pods) of one stage")
    gpus_per_node: int = Field(
        8, ge=0, description="GPUs per job node, one training process each; 0 with device cpu"
    )
    node_resources: NodeResources = NodeResources()
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="node labels job and rollout pods need"
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="taints job and rollout pods tolerate"
    )
    service_account: str = Field("ringzero", description="service account of job and rollout pods")
    s3_secret: S3SecretRef
    run_user: int = Field(
        10001, ge=1, description="non-root uid (and gid) every pod runs as; matches the images"
    )
    rollout: RolloutSettings = RolloutSettings()
    job_timeout_s: float = Field(
        2 * 24 * 3600.0,
        gt=0,
        description="fail a stage job that runs longer than this (its pods running or not)",
    )
    pending_timeout_s: float = Field(
        600.0,
        gt=0,
        description="fail a stage when one of its pods stays unschedulable this long (no node with "
        "the GPUs, CPU or memory it asks for, a node selector or taint nothing matches, a quota)",
    )
    image_pull_timeout_s: float = Field(
        300.0,
        gt=0,
        description="fail a stage when a container's image has not been pulled this long after the "
        "first failed pull (an image name that cannot be pulled fails at once)",
    )
    crash_loop_restarts: int = Field(
        3, ge=1, description="fail a stage when a container has restarted this often (CrashLoopBackOff)"
    )
    log_lines: int = Field(
        50, ge=1, le=5000, description="last log lines of each failed pod put in the error"
    )
    ipc_lock: bool = Field(
        False,
        description="add the IPC_LOCK capability to trainer and SGLang containers, for NCCL over "
        "InfiniBand (memory registration pins pages); relaxes the restricted Pod Security profile",
    )

    @field_validator("service_account", "runtime")
    @classmethod
    def _names(cls, v: str, info) -> str:
        return _dns_label(v, info.field_name)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        return None if v is None else _dns_label(v, "namespace")

    @model_validator(mode="after")
    def _device_gpus(self) -> ClusterSettings:
        if self.device == "cpu" and self.gpus_per_node:
            raise ValueError(f"gpus_per_node must be 0 when device is cpu (got {self.gpus_per_node})")
        if self.device == "gpu" and not self.gpus_per_node:
            raise ValueError("gpus_per_node must be at least 1 when device is gpu")
        if self.device == "cpu" and self.ipc_lock:
            raise ValueError(
                "ipc_lock is for NCCL over InfiniBand on GPU nodes; with device cpu it would only "
                "relax the pods' security profile"
            )
        return self

    def job_image(self) -> ImageRef:
        return self.images.trainer if self.device == "gpu" else self.images.cpu

    def procs_per_node(self) -> int:
        """Training processes per node: one per GPU, or one on CPU nodes."""
        return self.gpus_per_node or 1

    def world_size(self) -> int:
        """Ranks of one stage job: nodes x processes per node (the run's parallel.dp x parallel.cp)."""
        return self.num_nodes * self.procs_per_node()
