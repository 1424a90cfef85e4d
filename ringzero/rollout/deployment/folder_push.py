"""Weight pushes through a shared volume (``weight_sync: disk``): what SGLang's ``/update_weights_from_disk``
reads.

Rank 0 writes the weights as a Ling 2.5 model folder under ``weights_dir`` (a volume the trainer mounts
read-write and every server read-only), then every replica is told its path. The folder is written whole
or not at all (``write_folder`` renames a finished folder into place), so a server never reads a torn
one; a folder left by an interrupted push of the same version is reused. Folders older than the one
before are deleted after a push succeeds: a server may still be reading the previous one.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import structlog
import torch

from ringzero.model.config import ModelConfig

log = structlog.get_logger(__name__)
PREFIX = "weights-"
KEEP = 2


def folder_for(weights_dir: str, version: str) -> Path:
    return Path(weights_dir) / (PREFIX + re.sub(r"[^A-Za-z0-9_.=+-]", "_", version))


def push_folder(
    client,
    state_dict: dict[str, torch.Tensor],
    version: str,
    *,
    model_cfg: ModelConfig,
    weights_dir: str,
    runtime=None,
    tokenizer=None,
    dtype: torch.dtype | None = None,
) -> str:
    """Write (rank 0) and push the folder of ``state_dict``; every rank calls this. Returns its path."""
    from ringzero.model.hf_folder import write_folder

    path = folder_for(weights_dir, version)
    if runtime is None or runtime.is_main:
        if not (path / "config.json").is_file():
            Path(weights_dir).mkdir(parents=True, exist_ok=True)
            write_folder(path, model_cfg, state_dict, tokenizer, dtype)
    client.update_weights_from_disk(str(path), version)
    if runtime is None or runtime.is_main:
        _prune(Path(weights_dir), keep=path)
    return str(path)


def _prune(weights_dir: Path, keep: Path) -> None:
    folders = sorted(
        (p for p in weights_dir.glob(PREFIX + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime
    )
    old = [p for p in folders if p != keep][: max(0, len(folders) - KEEP)]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
        log.info("rollout.weights_pruned", folder=str(p))
