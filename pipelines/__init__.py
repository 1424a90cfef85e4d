"""The staged ringzero run as a Kubeflow pipeline: built from a run config, compiled, run locally or
submitted."""
