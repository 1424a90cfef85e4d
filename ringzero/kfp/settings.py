"""``load_kfp_config``: a run config with the ``kfp:`` section checked against what a step can run.

The settings models themselves are ``ringzero.config.kfp`` (``KfpSettings``, ``StagePod``).
"""

from __future__ import annotations

from pathlib import Path

from ringzero.config.kfp import KfpSettings, stage_pod_rank_problem
from ringzero.config.loader import load_config
from ringzero.config.run import RunConfig
from ringzero.errors import ConfigError


def load_kfp_config(path: str | Path, overrides: list[str] | None = None) -> tuple[RunConfig, KfpSettings]:
    """``load_config`` plus the run's ``kfp`` section (overrides may address it: ``kfp.mode=cluster``).

    Refuses a config whose in-process steps would run a different number of ranks than
    ``parallel.dp x parallel.cp`` (see ``stage_pod_rank_problem``).
    """
    cfg = load_config(path, overrides)
    in_process = cfg.kfp.mode == "in-process"
    problem = (
        stage_pod_rank_problem(
            cfg.kfp.stage_pod,
            cfg.parallel.dp,
            cfg.parallel.cp,
            cfg.engines.training.tp,
            cfg.engines.training.pp,
        )
        if in_process
        else None
    )
    if problem:
        raise ConfigError(str(path), [problem])
    return cfg, cfg.kfp
