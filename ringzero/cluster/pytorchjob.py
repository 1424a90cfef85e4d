"""Render a stage as a Training Operator v1 ``PyTorchJob``: the fallback for clusters without Trainer v2.

One Master and ``num_nodes - 1`` Workers share one pod template.

How the ranks start: the operator runs the container command once per pod and sets, on every pod,
``MASTER_ADDR`` (the Master's Service) and ``MASTER_PORT`` (the container port named
``pytorchjob-port``), plus ``WORLD_SIZE``/``RANK`` and ``PET_NNODES``/``PET_NODE_RANK``/
``PET_NPROC_PER_NODE`` (from ``nprocPerNode``). ``WORLD_SIZE``/``RANK`` describe one process per pod, the
mode for scripts started without a launcher; with ``nprocPerNode`` ranks per pod the command must be
``torchrun``, which replaces them with each worker's own. We give torchrun the node and process counts
explicitly and a c10d rendezvous at ``$(MASTER_ADDR):$(MASTER_PORT)`` (expanded by the kubelet), with
no ``elasticPolicy``: the node count is fixed, and the operator's elastic mode would only add a
min/max node range we do not want.
"""

from __future__ import annotations

import copy

import ringzero.cluster.pods as pods
from ringzero.cluster.job import TORCHRUN, StageJob, torchrun_args
from ringzero.cluster.labels import metadata
from ringzero.config.cluster import ClusterSettings

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"  # the operator finds the training container by this name
# The operator takes MASTER_PORT from the container port of this name (its default port, set explicitly).
PORT_NAME, PORT = "pytorchjob-port", 23456
RENDEZVOUS = "$(MASTER_ADDR):$(MASTER_PORT)"


def render_pytorchjob(settings: ClusterSettings, job: StageJob, extra_args: tuple[str, ...] = ()) -> dict:
    image = settings.job_image()
    labels = job.labels("trainer")
    main = pods.container(
        CONTAINER,
        image.ref(),
        image.pull_policy,
        TORCHRUN,
        torchrun_args(settings, job, RENDEZVOUS, extra_args),
        env=[*job.plain_env(), *pods.writable_home_env(), *pods.s3_credential_env()],
        resources=pods.resources(settings.node_resources, settings.gpus_per_node),
        mounts=[*pods.scratch_mounts(), pods.run_config_mount(), pods.s3_credential_mount()],
        ipc_lock=settings.ipc_lock,
        ports=[{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
    )
    template = {
        "metadata": {"labels": dict(labels)},
        "spec": pods.pod_spec(
            settings,
            [main],
            volumes=[
                *pods.scratch_volumes(settings.node_resources),
                pods.run_config_volume(job.config_map_name()),
                pods.s3_credential_volume(settings.s3_secret),
            ],
        ),
    }
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if settings.num_nodes > 1:
        replicas["Worker"] = {
            "replicas": settings.num_nodes - 1,
            "restartPolicy": "Never",
            "template": copy.deepcopy(template),
        }
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
