"""Render the SGLang rollout servers of a stage: a Deployment, the Service the trainer calls, and a headless
Service that names every server pod.

An init container copies the policy checkpoint from the store into an emptyDir (verifying it), then
SGLang serves it. Its numerics follow the run's rollout precision policy (flag names as in SGLang's
``python/sglang/srt/server_args.py``):

- ``--dtype`` is the policy's body dtype (bfloat16 or float32; SGLang has no float64, so a float64 rollout
  body runs only on the embedded engine);
- ``--enable-fp32-lm-head`` when the policy keeps the LM head in FP32;
- ``--enable-deterministic-inference`` when the run asks for deterministic rollouts; ``--random-seed`` is
  always the run's seed;
- ``--enable-return-routed-experts`` when the stage replays the rollout's MoE routing in training
  (``loss.routing_replay``): without it SGLang refuses ``return_routed_experts`` on every request.

The attention-softmax island (``attention_softmax_fp32``) has no counterpart: SGLang has no server flag
for the precision of the attention softmax. Its attention kernels choose it themselves; the policy
field is not passed on, and the train/rollout gap measured against SGLang includes that choice.

Weight pushes reach every replica at its own address: the headless Service (``clusterIP: None``, only
ready pods published) gives one DNS A record per server pod, which the trainer resolves
(``engines.rollout.replica_dns``). For disk weight sync a PersistentVolumeClaim is mounted at the same
path in trainer and server pods (``shared_weights_volume`` / ``with_shared_weights``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import ringzero.cluster.pods as pods
from ringzero.cluster.job import StageJob
from ringzero.cluster.labels import metadata
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.store.config import S3Settings

PORT = 30000
MODEL_DIR = "/models/policy"
SHARED_WEIGHTS = "shared-weights"
RINGZERO_SITE = "/opt/ringzero"
"""Where the rollout image installs ringzero and its pinned packages (images/rollout/Dockerfile), apart from
SGLang's environment: on the fetch-model container's PYTHONPATH only."""
SGLANG_DTYPES = {"bfloat16": "bfloat16", "float32": "float32"}
"""The rollout body dtypes SGLang serves, as its ``--dtype`` spells them."""


@dataclass(frozen=True)
class RolloutSpec:
    model_uri: str  # committed checkpoint in the store, s3://BUCKET/PREFIX/...
    s3: S3Settings
    lm_head_fp32: bool
    deterministic: bool
    seed: int
    body: str = "bfloat16"  # the rollout policy's body dtype
    routed_experts: bool = False  # the stage replays the rollout's MoE routing

    @classmethod
    def from_run_config(cls, cfg, model_uri: str, stage=None) -> RolloutSpec:
        """Take precision, determinism and seed from a ``RunConfig`` so rollout matches the run, and
        from the stage whether its servers must return routed experts."""
        policy = cfg.precision.rollout
        routed = bool(getattr(getattr(stage, "loss", None), "routing_replay", False))
        return cls(
            model_uri=model_uri,
            s3=cfg.storage.s3,
            lm_head_fp32=policy.lm_head_fp32,
            deterministic=cfg.precision.deterministic,
            seed=cfg.run.seed,
            body=policy.body,
            routed_experts=routed,
        )


def sglang_args(settings: ClusterSettings, spec: RolloutSpec) -> list[str]:
    if spec.body not in SGLANG_DTYPES:
        raise RingzeroError(
            f"precision.rollout.body {spec.body!r}: SGLang serves bfloat16 or float32 weights (its --dtype "
            "has no "
            "float64); run a float64 rollout on the embedded engine (engines.rollout.kind: embedded)"
        )
    args = [
        "--model-path",
        MODEL_DIR,
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--tp-size",
        str(settings.rollout.tp_size),
        "--dtype",
        SGLANG_DTYPES[spec.body],
        "--random-seed",
        str(spec.seed),
    ]
    if spec.lm_head_fp32:
        args.append("--enable-fp32-lm-head")
    if spec.deterministic:
        args.append("--enable-deterministic-inference")
    if spec.routed_experts:
        args.append("--enable-return-routed-experts")
    # No flag for attention_softmax_fp32: SGLang has none (see the module docstring).
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
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def shared_weights_volume(settings: ClusterSettings) -> tuple[dict, dict] | None:
    """The disk-sync volume and its mount, when the settings name a claim."""
    claim = settings.rollout.shared_weights_pvc
    if claim is None:
        return None
    return (
        {"name": SHARED_WEIGHTS, "persistentVolumeClaim": {"claimName": claim}},
        {"name": SHARED_WEIGHTS, "mountPath": settings.rollout.shared_weights_mount},
    )


def weights_dir(settings: ClusterSettings, job: StageJob) -> str:
    """The launch's own folder on the shared volume: pushed model folders go there."""
    return f"{settings.rollout.shared_weights_mount}/{job.name}"


def render_rollout(settings: ClusterSettings, job: StageJob, spec: RolloutSpec) -> list[dict]:
    """The Deployment, its Service and the headless Service of its pods, in creation order."""
    image = settings.images.rollout
    labels = job.labels("rollout")
    name = job.rollout_name()
    models = {"name": "models", "emptyDir": {}}
    models_mount = {"name": "models", "mountPath": "/models"}
    volumes, mounts = (
        [*pods.scratch_volumes(settings.rollout.resources), models],
        [*pods.scratch_mounts(), models_mount],
    )
    # Only the fetch-model init container mounts the keys; the SGLang server never reads the store.
    volumes.append(pods.s3_credential_volume(settings.s3_secret))
    if shared := shared_weights_volume(settings):
        volumes.append(shared[0])
        mounts.append({**shared[1], "readOnly": True})
    creds = pods.s3_credential_env()
    fetch = pods.container(
        "fetch-model",
        image.ref(),
        image.pull_policy,
        ["python3", "-m", "ringzero.cluster.fetch_model"],
        fetch_args(spec),
        env=[*pods.writable_home_env(), *creds, {"name": "PYTHONPATH", "value": RINGZERO_SITE}],
        resources=pods.resources(settings.rollout.resources, 0),
        mounts=[pods.scratch_mounts()[0], models_mount, pods.s3_credential_mount()],
    )
    # Loading a large model takes minutes: the startup probe allows the whole ready timeout.
    startup_failures = max(1, int(settings.rollout.ready_timeout_s // 10))
    server = pods.container(
        "sglang",
        image.ref(),
        image.pull_policy,
        ["python3", "-m", "sglang.launch_server"],
        sglang_args(settings, spec),
        env=[*job.plain_env(), *pods.writable_home_env()],
        resources=pods.resources(settings.rollout.resources, settings.rollout.tp_size),
        mounts=mounts,
        ipc_lock=settings.ipc_lock,
        ports=[{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        startupProbe=_probe(10, startup_failures),
        readinessProbe=_probe(10, 3),
        livenessProbe=_probe(30, 5),
    )
    pod = pods.pod_spec(settings, [server], init_containers=[fetch], restart_policy="Always", volumes=volumes)
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
    ports = [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, job.namespace, labels, job.owner),
        "spec": {"type": "ClusterIP", "selector": dict(labels), "ports": ports},
    }
    # One A record per ready server pod: the trainer pushes weights to each of them, not to whichever one a
    # load-balanced Service picks.
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(replicas_name(job), job.namespace, labels, job.owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": dict(labels),
            "ports": copy.deepcopy(ports),
        },
    }
    return [deployment, service, headless]


def with_shared_weights(settings: ClusterSettings, training_job: dict) -> dict:
    """``training_job`` (a TrainJob or PyTorchJob) with the shared weights volume mounted in every node's
    pod."""
    shared = shared_weights_volume(settings)
    if shared is None:
        return training_job
    volume, mount = shared
    job = copy.deepcopy(training_job)
    if job["kind"] == "TrainJob":
        specs = [
            rj["template"]["spec"]["template"]["spec"]
            for patch in job["spec"]["runtimePatches"]
            for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        ]
    elif job["kind"] == "PyTorchJob":
        specs = [role["template"]["spec"] for role in job["spec"]["pytorchReplicaSpecs"].values()]
    else:
        raise RingzeroError(f"cannot mount the shared weights volume into a {job['kind']}")
    for spec in specs:
        spec.setdefault("volumes", []).append(dict(volume))
        for container in spec["containers"]:
            container.setdefault("volumeMounts", []).append(dict(mount))
    return job


def replicas_name(job: StageJob) -> str:
    """The headless Service of the launch's server pods (the launch name's suffixes stay within 8
    characters)."""
    return f"{job.name}-pods"


def endpoint(job: StageJob) -> str:
    """The URL the stage's trainer uses to reach the rollout Service."""
    return f"http://{job.rollout_name()}.{job.namespace}.svc:{PORT}"


def replica_dns(job: StageJob) -> str:
    """``host:port`` whose DNS A records are the launch's ready server pods."""
    return f"{replicas_name(job)}.{job.namespace}.svc:{PORT}"
