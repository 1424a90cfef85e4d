"""Typed run configuration: ``load_config(path, overrides)`` returns a validated ``RunConfig``.

Exports resolve lazily: every component's config module imports ``ringzero.config.base``, and the
run schema imports those modules, so an eager import here would make them circular.
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
