"""The shipped configs gate on the engine gap (gap/*), and only on metrics an RL stage's summary carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringzero.config import load_config
from ringzero.stages.rl import SUMMARY_KEYS

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_rl_gates_read_the_engine_gap_from_the_summary(path):
    cfg = load_config(path)
    gated = [t.metric for s in cfg.stages if s.kind == "rl" for t in s.gate]
    assert gated, f"{path.name} gates no RL stage"
    for metric in gated:
        # a gate on a metric the summary lacks fails as "missing"; eval/* comes from the held-out evaluation
        assert metric in SUMMARY_KEYS or metric.startswith("eval/"), metric
        assert not metric.startswith(("ratio/", "logratio/")), (
            f"{metric}: the all-minibatch tail includes staleness"
        )
    assert "gap/ratio/p99" in gated
    for s in cfg.stages:
        for t in getattr(s, "stop_when", []):
            assert not t.metric.startswith(("ratio/", "logratio/")), t.metric


def test_the_chart_carries_the_cluster_config_unchanged():
    assert (ROOT / "helm/ringzero/files/runs/cluster-h200.yaml").read_text() == (
        ROOT / "configs/cluster-h200.yaml"
    ).read_text()
