"""Render a stage as a Training Operator v1 ``PyTorchJob``: the fallback for clusters without Trainer v2.

One Master and ``num_nodes - 1`` Workers share one pod template; the operator sets the rendezvous
variables (MASTER_ADDR, node rank, ``PET_*``) that torchrun reads.
"""

from __future__ import annotations

import copy

from ringzero.cluster import pods
from ringzero.cluster.config import ClusterSettings
from ringzero.cluster.job import StageJob
from ringzero.cluster.labels import metadata

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"  # the operator finds the training container by this name


def render_pytorchjob(settings: ClusterSettings, job: StageJob, extra_args: tuple[str, ...] = ()) -> dict:
    image = settings.job_image()
    labels = job.labels("trainer")
    main = pods.container(
        CONTAINER, image.ref(), image.pull_policy, job.command(), job.args(extra_args),
        env=[*job.plain_env(), *pods.writable_home_env(), *pods.s3_credential_env(settings.s3_secret)],
        resources=pods.resources(settings.node_resources, settings.gpus_per_node),
        mounts=[*pods.scratch_mounts(), pods.run_config_mount()],
    )
    template = {
        "metadata": {"labels": dict(labels)},
        "spec": pods.pod_spec(
            settings, [main],
            volumes=[*pods.scratch_volumes(settings.node_resources), pods.run_config_volume(job.config_map_name())],
        ),
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if settings.num_nodes > 1:
        replicas["Worker"] = {"replicas": settings.num_nodes - 1, "restartPolicy": "Never",
                              "template": copy.deepcopy(template)}
    return {
        "apiVersion": API_VERSION,
        "kind": "PyTorchJob",
        "metadata": metadata(job.name, job.namespace, labels, job.owner),
        "spec": {
            "nprocPerNode": str(settings.procs_per_node()),
            "runPolicy": {
                "activeDeadlineSeconds": int(settings.job_timeout_s),
                # A failed stage is resumed by the pipeline from its last checkpoint, not retried in place.
                "backoffLimit": 0,
                # Keep pods after the end so their logs can be read; the launcher deletes the job.
                "cleanPodPolicy": "None",
            },
            "pytorchReplicaSpecs": replicas,
        },
    }
