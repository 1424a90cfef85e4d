"""Kubeflow Pipelines support: typed pod settings, and the code each pipeline step runs inside its pod.

The pipeline itself (``pipelines/``) and its component signatures (``components/``) live in the source
tree; the component bodies only call into this package, which is what the step images install.
"""
