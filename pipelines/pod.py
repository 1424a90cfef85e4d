"""Pod settings of the pipeline's steps, from ``KfpSettings``: every Kubernetes detail is set here."""

from __future__ import annotations

from kfp import kubernetes
from kfp.dsl import PipelineTask

from ringzero.config.kfp import KfpSettings

S3_FILE_ENV = {"access": "RINGZERO_S3_ACCESS_KEY_FILE", "secret": "RINGZERO_S3_SECRET_KEY_FILE"}
# The chart's mount point for the same Secret: a step pod and a stage job read the keys at one path.
S3_SECRET_DIR = "/etc/ringzero/s3"


def apply_pod_settings(
    task: PipelineTask, settings: KfpSettings, *, runs_stage: bool, uses_store: bool
) -> PipelineTask:
    """Resources, placement and credentials of one step.

    ``runs_stage``: the step executes a stage; in in-process mode its pod does the training, so it gets
    the GPUs, resources and node placement (in cluster mode the training job gets them instead).
    ``uses_store``: the step reads or writes the checkpoint store, so it needs the S3 credentials.
    """
    # Stages are cached by identity in the checkpoint store; KFP's own cache cannot see the store
    # (a wiped store, a resumable half-finished stage), so it would skip steps that must run.
    task.set_caching_options(False)
    if uses_store and settings.s3_secret is not None:
        secret = settings.s3_secret
        # Mounted as files, never put in the environment (where `kubectl describe`, crash dumps and child
        # processes would see the values); the store reads the *_FILE paths.
        kubernetes.use_secret_as_volume(task, secret_name=secret.name, mount_path=S3_SECRET_DIR)
        task.set_env_variable(S3_FILE_ENV["access"], f"{S3_SECRET_DIR}/{secret.access_key_key}")
        task.set_env_variable(S3_FILE_ENV["secret"], f"{S3_SECRET_DIR}/{secret.secret_key_key}")
    if runs_stage and settings.mode == "cluster":
        # The launcher makes this pod the owner of the job it creates, so deleting the step cleans up.
        kubernetes.use_field_path_as_env(task, env_name="RINGZERO_POD_NAME", field_path="metadata.name")
        kubernetes.use_field_path_as_env(task, env_name="RINGZERO_POD_UID", field_path="metadata.uid")
    if not (runs_stage and settings.mode == "in-process"):
        return task
    pod = settings.stage_pod
    if pod.cpu is not None:
        task.set_cpu_request(pod.cpu)
    if pod.memory is not None:
        task.set_memory_request(pod.memory).set_memory_limit(pod.memory)
    if pod.gpus:
        task.set_accelerator_type(pod.accelerator).set_accelerator_limit(pod.gpus)
    for key, value in sorted(pod.node_selector.items()):
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for t in pod.tolerations:
        kubernetes.add_toleration(task, key=t.key, operator=t.operator, value=t.value, effect=t.effect)
    return task
