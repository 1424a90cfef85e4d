"""Cluster mode: render a stage as Kubernetes objects, launch them, wait, and clean up.

Rendering is pure (``trainjob``, ``pytorchjob``, ``rollout``, ``job``); ``launch.launch_stage`` drives
any ``api.ClusterApi``; ``kube.KubernetesApi`` is the real client. Heavy imports stay in those modules.
"""


def execute_stage_on_cluster(cfg, store, stage, inputs, run_dir, **kwargs):
    """The pipeline step's entry point in cluster mode (see ``ringzero.cluster.step``)."""
    from ringzero.cluster.step import execute_stage_on_cluster as run

    return run(cfg, store, stage, inputs, run_dir, **kwargs)
