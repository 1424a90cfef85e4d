"""Cluster mode: render a stage as Kubernetes objects, launch them, wait, and clean up.

Rendering is pure (``trainjob``, ``pytorchjob``, ``rollout``, ``job``); ``launch.launch_stage`` drives
any ``api.ClusterApi``; ``kube.KubernetesApi`` is the real client. Heavy imports stay in those modules.
"""
