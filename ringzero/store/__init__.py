"""Checkpoint store: one interface over file:// and s3:// with manifests, checksums and commit markers.

    store = open_store("s3://bucket/run1", s3_settings)    # or "file://runs/store"
    uri = store.save("step-000100", tensors, config, meta)  # committed when it returns
    ckpt = store.load(uri)                                  # .tensors .config .meta .files .uri, all verified
    store.export_folder(uri, "/models/policy")              # a plain Hugging Face model folder

Layout and commit protocol: ``checkpoint.py`` (file names: ``layout.py``). Local folders: ``folder.py``.
Backends: ``local.py``, ``s3.py``.
"""

import importlib

# Resolved lazily: the run config imports ``ringzero.store.config``, and loading a config must not pull
# in torch/safetensors through the checkpoint module.
_EXPORTS = {
    "MissingObjectError": "ringzero.store.backend",
    "Checkpoint": "ringzero.store.checkpoint",
    "CheckpointStore": "ringzero.store.checkpoint",
    "GcResult": "ringzero.store.checkpoint",
    "load_checkpoint": "ringzero.store.opener",
    "open_store": "ringzero.store.opener",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ringzero.store' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
