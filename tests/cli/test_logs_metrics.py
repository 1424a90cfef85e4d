"""Structured logs go to the run folder as JSON lines; metric keys are namespaced."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import structlog

from ringzero.logs import attach_run_log, setup_logging
from ringzero.metrics import MemoryMetricWriter, MetricWriter, distribution, read_metrics


def test_run_log_is_json_lines(tmp_path):
    setup_logging("info")
    path = attach_run_log(tmp_path)
    structlog.get_logger("ringzero.test").info("stage.start", stage="stage1", step=3)
    for h in logging.getLogger().handlers:
        h.flush()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert (
        records[-1]["event"] == "stage.start"
        and records[-1]["stage"] == "stage1"
        and records[-1]["step"] == 3
    )
    assert records[-1]["level"] == "info"
    logging.getLogger().handlers[:] = []


def test_metric_writer_round_trip_and_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricWriter(path) as w:
        w.log(1, {"ratio/p99": np.float32(0.5), "len/mean": 12})
        w.log(2, {"ratio/p99": float("inf"), "reward/mean": float("nan")})
    with path.open("a") as fh:
        fh.write('{"step": 3, "ratio/p9')  # a crash mid-write
    recs = read_metrics(path)
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[0]["ratio/p99"] == pytest.approx(0.5) and recs[1]["reward/mean"] is None


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="m.jsonl:2"):
        read_metrics(path)


@pytest.mark.parametrize("key", ["p99", "/p99", "ratio/", ""])
def test_keys_must_be_namespaced(key):
    with pytest.raises(ValueError, match="namespaced"):
        MemoryMetricWriter().log(0, {key: 1.0})


def test_distribution_matches_numpy():
    x = np.random.default_rng(0).exponential(size=10_000)
    d = distribution("ratio", x)
    assert d["ratio/max"] == x.max()
    assert d["ratio/p99"] == pytest.approx(np.quantile(x, 0.99))
    assert d["ratio/p50"] < d["ratio/p90"] < d["ratio/p99"] < d["ratio/p99.9"] <= d["ratio/max"]


def test_merge_by_step_prefers_the_rerun_and_merges_sources():
    from ringzero.metrics import merge_by_step

    records = [
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/mean": 0.2},  # logged, then the process died before checkpointing step 2
        {"step": 2, "reward/mean": 0.25},  # the resumed attempt's step 2
        {"step": 2, "eval/accuracy": 0.5},
        {"step": 3, "reward/mean": 0.3},
    ]
    merged = merge_by_step(records)
    assert [r["step"] for r in merged] == [1, 2, 3]
    assert merged[1] == {"step": 2, "reward/mean": 0.25, "eval/accuracy": 0.5}
