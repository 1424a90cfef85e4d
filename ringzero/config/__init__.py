"""Typed run configuration: ``load_config(path, overrides)`` returns a validated ``RunConfig``.

The config layer imports only the floors below it (``strict_model``, ``model``, ``tasks``, ``parallel``,
``store`` config modules): every schema a run file holds lives here, the stage schemas in ``stages`` and
the mismatch corrections' in ``corrections``, so nothing here looks up at the code that runs them.

The four exports resolve lazily, so that importing one settings module (``gates``, ``cluster``) does not
import the whole run schema and the component modules behind it.
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
