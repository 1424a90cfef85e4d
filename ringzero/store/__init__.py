"""Checkpoint store: one interface over file:// and s3:// with manifests, checksums and commit markers.

    store = open_store("s3://bucket/run1", s3_settings)    # or "file://runs/store"
    uri = store.save("step-000100", tensors, config, meta)  # committed when it returns
    ckpt = store.load(uri)                                  # .tensors .config .meta .uri, all verified

Layout and commit protocol: ``checkpoint.py``. Backends: ``local.py``, ``s3.py``.
"""

from ringzero.store.backend import MissingObjectError
from ringzero.store.checkpoint import Checkpoint, CheckpointStore, GcResult
from ringzero.store.opener import load_checkpoint, open_store

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "GcResult",
    "MissingObjectError",
    "load_checkpoint",
    "open_store",
]
