"""Render a stage as a Kubeflow Trainer v2 ``TrainJob`` on the standard ``torch-distributed`` runtime.

The runtime (a cluster-scoped ClusterTrainingRuntime) owns the JobSet template; the TrainJob sets the
image, command, node count and GPUs, and patches the pod template through ``runtimePatches`` with what
the runtime cannot know: the hardened security context, scratch volumes, node placement and labels.
Trainer sets the ``PET_*`` variables (nodes, node rank, master address) that torchrun reads.
"""

from __future__ import annotations

from ringzero.cluster import pods
from ringzero.cluster.config import ClusterSettings
from ringzero.cluster.job import StageJob
from ringzero.cluster.labels import metadata

API_VERSION = "trainer.kubeflow.org/v1alpha1"
# The names the standard torch-distributed runtime gives its replicated job and container.
RUNTIME_JOB = "node"
RUNTIME_CONTAINER = "node"
PATCH_MANAGER = "ringzero.dev/launcher"


def render_trainjob(settings: ClusterSettings, job: StageJob, extra_args: tuple[str, ...] = ()) -> dict:
    image = settings.job_image()
    labels = job.labels("trainer")
    pod_patch = {
        "securityContext": pods.pod_security(settings),
        "serviceAccountName": settings.service_account,
        "volumes": [*pods.scratch_volumes(settings.node_resources), pods.run_config_volume(job.config_map_name())],
        "containers": [{
            "name": RUNTIME_CONTAINER,
            "securityContext": pods.container_security(),
            "volumeMounts": [*pods.scratch_mounts(), pods.run_config_mount()],
        }],
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
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                           "name": settings.runtime},
            # The cluster ends the job even if the launcher died and could not.
            "activeDeadlineSeconds": int(settings.job_timeout_s),
            "trainer": {
                "image": image.ref(),
                "command": job.command(),
                "args": job.args(extra_args),
                "env": [*job.plain_env(), *pods.writable_home_env(), *pods.s3_credential_env(settings.s3_secret)],
                "numNodes": settings.num_nodes,
                "numProcPerNode": settings.procs_per_node(),
                "resourcesPerNode": pods.resources(settings.node_resources, settings.gpus_per_node),
            },
            "runtimePatches": [{
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": RUNTIME_JOB,
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {"template": {"metadata": {"labels": dict(labels)}, "spec": pod_patch}},
                    },
                }]}}},
            }],
        },
    }
