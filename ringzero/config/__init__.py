"""Typed run configuration: ``load_config(path, overrides)`` returns a validated ``RunConfig``.

The config layer imports nothing above it: the cluster and Kubeflow settings models live here
(``cluster``, ``kfp``), and the run schema takes the other sections from the component config modules
(``ringzero.stages.config``, ``model.config``, ...), which import only ``base`` and ``gates``.

The four exports still resolve lazily, for that last reason: a component config module may be the
first import of a process, and it imports ``ringzero.config.base``, which runs this file first; an
eager ``from ringzero.config.run import RunConfig`` here would then import that same half-initialized
component module back through the run schema.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RunConfig": "ringzero.config.run",
    "config_hash": "ringzero.config.loader",
    "load_config": "ringzero.config.loader",
    "parse_config": "ringzero.config.loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ringzero.config' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
