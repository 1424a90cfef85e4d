"""Render the SGLang rollout servers of a stage: a Deployment and the Service the trainer calls.

An init container copies the policy checkpoint from the store into an emptyDir (verifying it), then
SGLang serves it. Its numerics follow the run's rollout precision policy: ``--enable-fp32-lm-head``
when the policy keeps the LM head in FP32, deterministic inference when the run asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.cluster import pods
from ringzero.cluster.job import StageJob
from ringzero.cluster.labels import metadata
from ringzero.config.cluster import ClusterSettings
from ringzero.store.config import S3Settings

PORT = 30000
MODEL_DIR = "/models/policy"


@dataclass(frozen=True)
class RolloutSpec:
    model_uri: str  # committed checkpoint in the store, s3://BUCKET/PREFIX/...
    s3: S3Settings
    lm_head_fp32: bool
    deterministic: bool
    seed: int

    @classmethod
    def from_run_config(cls, cfg, model_uri: str) -> RolloutSpec:
        """Take precision, determinism and seed from a ``RunConfig`` so rollout matches the run."""
        return cls(model_uri=model_uri, s3=cfg.storage.s3, lm_head_fp32=cfg.precision.rollout.lm_head_fp32,
                   deterministic=cfg.precision.deterministic, seed=cfg.run.seed)


def sglang_args(settings: ClusterSettings, spec: RolloutSpec) -> list[str]:
    args = ["--model-path", MODEL_DIR, "--host", "0.0.0.0", "--port", str(PORT),
            "--tp-size", str(settings.rollout.tp_size), "--random-seed", str(spec.seed)]
    if spec.lm_head_fp32:
        args.append("--enable-fp32-lm-head")
    if spec.deterministic:
        args.append("--enable-deterministic-inference")
    return args


def fetch_args(spec: RolloutSpec) -> list[str]:
    args = [spec.model_uri, MODEL_DIR, "--endpoint", spec.s3.endpoint]
    if spec.s3.secure:
        args.append("--secure")
    if spec.s3.region:
        args += ["--region", spec.s3.region]
    if not spec.s3.cert_check:
        args.append("--no-cert-check")
    return args


def _probe(period_s: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period_s,
            "timeoutSeconds": 5, "failureThreshold": failures}


def render_rollout(settings: ClusterSettings, job: StageJob, spec: RolloutSpec) -> list[dict]:
    """The Deployment and its Service, in creation order."""
    image = settings.images.rollout
    labels = job.labels("rollout")
    name = job.rollout_name()
    models = {"name": "models", "emptyDir": {}}
    models_mount = {"name": "models", "mountPath": "/models"}
    creds = pods.s3_credential_env(settings.s3_secret)
    fetch = pods.container(
        "fetch-model", image.ref(), image.pull_policy, ["python3", "-m", "ringzero.cluster.fetch_model"],
        fetch_args(spec), env=[*pods.writable_home_env(), *creds],
        resources=pods.resources(settings.rollout.resources, 0), mounts=[pods.scratch_mounts()[0], models_mount],
    )
    # Loading a large model takes minutes: the startup probe allows the whole ready timeout.
    startup_failures = max(1, int(settings.rollout.ready_timeout_s // 10))
    server = pods.container(
        "sglang", image.ref(), image.pull_policy, ["python3", "-m", "sglang.launch_server"],
        sglang_args(settings, spec), env=[*job.plain_env(), *pods.writable_home_env()],
        resources=pods.resources(settings.rollout.resources, settings.rollout.tp_size),
        mounts=[*pods.scratch_mounts(), models_mount],
        ports=[{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        startupProbe=_probe(10, startup_failures),
        readinessProbe=_probe(10, 3),
        livenessProbe=_probe(30, 5),
    )
    pod = pods.pod_spec(settings, [server], init_containers=[fetch], restart_policy="Always",
                        volumes=[*pods.scratch_volumes(settings.rollout.resources), models])
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, job.namespace, labels, job.owner),
        "spec": {
            "replicas": settings.rollout.replicas,
            "selector": {"matchLabels": dict(labels)},
            "progressDeadlineSeconds": int(settings.rollout.ready_timeout_s),
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, job.namespace, labels, job.owner),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(labels),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [deployment, service]


def endpoint(job: StageJob) -> str:
    """The URL the stage's trainer uses to reach the rollout Service."""
    return f"http://{job.rollout_name()}.{job.namespace}.svc:{PORT}"
