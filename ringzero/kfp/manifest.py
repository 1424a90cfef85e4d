"""The run manifest, continued across pipeline steps: each step is a fresh process that adds its stage."""

from __future__ import annotations

from pathlib import Path

from ringzero.config.run import RunConfig
from ringzero.pipeline.manifest import RunManifest


def open_run_manifest(cfg: RunConfig, store, run_dir: Path, run_id: str) -> RunManifest:
    """The manifest this pipeline run has written so far, or a fresh one for a new run.

    The stored manifest of an earlier run (same run name) is replaced, never merged: its stages may
    come from another config.
    """
    manifest = RunManifest(cfg, store, run_dir)
    stored = store.get_json(manifest.key)
    if stored is not None and stored.get("pipeline_run") == run_id:
        manifest.doc = stored
    manifest.doc["pipeline_run"] = run_id
    return manifest
