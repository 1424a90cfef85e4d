"""Verifiable tasks: prompts with ground truth and pure, deterministic rewards.

``make_task(cfg)`` builds the task a run's ``task`` section describes; stages use only the ``Task``
interface of ``ringzero.tasks.base`` (``prompts``, ``reward``, ``uses_trace``, ``step_check``,
``with_tier``, ``stop``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringzero.tasks.base import Task
    from ringzero.tasks.config import ArithmeticTask, JsonlTask, SearchTask


def make_task(cfg: ArithmeticTask | SearchTask | JsonlTask, base_dir: str | Path | None = None) -> Task:
    """``base_dir`` resolves relative JSONL paths (the config file's folder); the cwd when None."""
    if cfg.kind == "arithmetic":
        from ringzero.tasks.arithmetic import SyntheticArithmetic

        return SyntheticArithmetic(cfg)
    if cfg.kind == "search":
        from ringzero.tasks.row_search import RowSearch

        return RowSearch(cfg)
    from ringzero.tasks.jsonl import JsonlDataset

    return JsonlDataset(cfg, base_dir)
