"""Render a stage as a Kubeflow Trainer v2 ``TrainJob`` on the standard ``torch-distributed`` runtime.

The runtime (a cluster-scoped ClusterTrainingRuntime) owns the JobSet template; the TrainJob sets the
image, command, node count and GPUs, and patches the pod template through ``runtimePatches`` with what
the runtime cannot know: the hardened security context, scratch volumes, node placement and labels.

How the ranks start: Trainer's torch plugin does not launch anything itself. It runs the TrainJob's
command once per node (``numNodes`` pods) and sets the ``PET_*`` variables torchrun reads
(``PET_NNODES``, ``PET_NPROC_PER_NODE`` from ``numProcPerNode``, ``PET_NODE_RANK``, and
``PET_MASTER_ADDR``/``PET_MASTER_PORT``, the first node's stable DNS name and port). So the command is
``torchrun`` itself; it gets the node and process counts explicitly (the same numbers as ``numNodes`` and
``numProcPerNode``) and a c10d rendezvous at ``$(PET_MASTER_ADDR):$(PET_MASTER_PORT)``, which the
kubelet expands from those variables. The runtime must therefore be one of the torch framework
(``torch-distributed`` or a copy of it).
"""

from __future__ import annotations

import ringzero.cluster.pods as pods
from ringzero.cluster.job import TORCHRUN, StageJob, torchrun_args
from ringzero.cluster.labels import metadata
from ringzero.config.cluster import ClusterSettings

API_VERSION = "trainer.kubeflow.org/v1alpha1"
# The names the standard torch-distributed runtime gives its replicated job and container.
RUNTIME_JOB = "node"
RUNTIME_CONTAINER = "node"
PATCH_MANAGER = "ringzero.dev/launcher"
# The first node's address and port, as the torch plugin sets them on every node.
RENDEZVOUS = "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)"


def render_trainjob(settings: ClusterSettings, job: StageJob, extra_args: tuple[str, ...] = ()) -> dict:
    image = settings.job_image()
    labels = job.labels("trainer")
    pod_patch = {
        "securityContext": pods.pod_security(settings),
        "serviceAccountName": settings.service_account,
        "volumes": [
            *pods.scratch_volumes(settings.node_resources),
            pods.run_config_volume(job.config_map_name()),
            pods.s3_credential_volume(settings.s3_secret),
        ],
        "containers": [
            {
                "name": RUNTIME_CONTAINER,
                "securityContext": pods.container_security(settings.ipc_lock),
                "volumeMounts": [*pods.scratch_mounts(), pods.run_config_mount(), pods.s3_credential_mount()],
            }
        ],
    }
    if settings.node_selector:
        pod_patch["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_patch["tolerations"] = [t.to_k8s() for t in settings.tolerations]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": metadata(job.name, job.namespace, labels, job.owner),
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": settings.runtime,
            },
            # The cluster ends the job even if the launcher died and could not.
            "activeDeadlineSeconds": int(settings.job_timeout_s),
            "trainer": {
                "image": image.ref(),
                "command": list(TORCHRUN),
                "args": torchrun_args(settings, job, RENDEZVOUS, extra_args),
                "env": [*job.plain_env(), *pods.writable_home_env(), *pods.s3_credential_env()],
                "numNodes": settings.num_nodes,
                "numProcPerNode": settings.procs_per_node(),
                "resourcesPerNode": pods.resources(settings.node_resources, settings.gpus_per_node),
            },
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": RUNTIME_JOB,
                                        "template": {
                                            "metadata": {"labels": dict(labels)},
                                            "spec": {
                                                "template": {
                                                    "metadata": {"labels": dict(labels)},
                                                    "spec": pod_patch,
                                                }
                                            },
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }
