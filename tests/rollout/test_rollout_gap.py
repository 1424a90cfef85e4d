"""The gap module's statistics on hand-made log-probs, and ``ringzero check gap`` end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from rollout_kit import TINY, policy, prompts, tiny_model

from ringzero.cli.main import main
from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import save_model
from ringzero.rollout.engine.gap import gap_stats, length_buckets, measure_gap
from ringzero.rollout.types import SamplingParams
from ringzero.store import open_store


def test_length_buckets():
    assert length_buckets([256, 1024]) == [("1-256", 1, 256), ("257-1024", 257, 1024), (">1024", 1025, None)]
    assert length_buckets([]) == [("all", 1, None)]
    with pytest.raises(RingzeroError, match="increasing"):
        length_buckets([8, 8])


def test_gap_stats_by_hand():
    # Trajectory A (2 tokens): r = 1 and r = 2; trajectory B (5 tokens): r = 1/2 once, else 1.
    train = [torch.tensor([0.0, math.log(2)]), torch.zeros(5)]
    rollout = [torch.zeros(2), torch.tensor([0.0, 0.0, math.log(2), 0.0, 0.0])]
    out = gap_stats(train, rollout, length_edges=[2, 4])
    a = out["all"]
    assert (a["trajectories"], a["tokens"], a["nonfinite"]) == (2, 7, 0)
    assert a["ratio/max"] == pytest.approx(1.0) and a["ratio/mean"] == pytest.approx(1.5 / 7)
    assert a["logratio/max"] == pytest.approx(math.log(2)) and a["logratio/p50"] == 0.0
    assert a["train_nll/mean"] == pytest.approx(-math.log(2) / 7)
    assert set(out["by_length"]) == {"1-2", ">4"}  # no trajectory of 3-4 tokens
    assert out["by_length"]["1-2"]["ratio/max"] == pytest.approx(1.0)
    assert out["by_length"][">4"]["ratio/max"] == pytest.approx(0.5)
    # Positions 1-2 hold both trajectories' first two tokens (r = 1, 2, 1, 1); 3-4 only B's (r = 1/2, 1).
    assert out["by_position"]["1-2"]["tokens"] == 4 and out["by_position"]["1-2"][
        "ratio/max"
    ] == pytest.approx(1.0)
    assert out["by_position"]["3-4"]["tokens"] == 2 and out["by_position"]["3-4"][
        "ratio/max"
    ] == pytest.approx(0.5)
    assert out["by_position"][">4"]["tokens"] == 1 and out["by_position"][">4"]["ratio/max"] == 0.0


def test_gap_stats_leaves_out_nonfinite_tokens_and_counts_them():
    out = gap_stats([torch.tensor([0.0, -math.inf])], [torch.tensor([0.0, -1.0])], [4])
    assert out["all"]["nonfinite"] == 1 and out["all"]["ratio/max"] == 0.0


def test_gap_stats_refuses_mismatched_lengths():
    with pytest.raises(RingzeroError, match="trajectory 0"):
        gap_stats([torch.zeros(3)], [torch.zeros(4)])


def test_measure_gap_orders_the_policies():
    model = tiny_model("float32", seed=2)
    params = SamplingParams(max_new_tokens=12)
    run = lambda t, r, det=False: measure_gap(  # noqa: E731
        model, prompts([4, 6, 3]), params, train_policy=policy(t), rollout_policy=policy(r), deterministic=det
    )
    fp64 = run("fp64", "fp64")
    bf16 = run("bf16", "bf16")
    det = run("bf16", "bf16", det=True)
    assert fp64["tokens"] == 36 and fp64["by_length"]["1-256"]["trajectories"] == 3
    assert 0 < fp64["all"]["ratio/max"] < 1e-9 < bf16["all"]["ratio/max"]
    assert det["all"]["ratio/max"] == 0.0 and det["all"]["logratio/max"] == 0.0
    with pytest.raises(RingzeroError, match="one policy on both sides"):
        run("fp32", "bf16", det=True)


@pytest.fixture
def model_yaml(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"model": TINY}))
    return str(path)


def _gap(capsys, *args):
    rc = main(
        ["check", "gap", *args, "--samples", "3", "--max-new-tokens", "6", "--prompt-len", "4", "--json"]
    )
    out = capsys.readouterr().out
    return rc, (json.loads(out) if rc == 0 else None)


def test_check_gap_cli_random_init(capsys, model_yaml):
    rc, report = _gap(
        capsys,
        "--init",
        "random",
        "--config",
        model_yaml,
        "--train-policy",
        "fp32-islands",
        "--rollout-policy",
        "bf16",
    )
    assert rc == 0
    assert (report["train_policy"], report["rollout_policy"], report["samples"]) == (
        "fp32-islands",
        "bf16",
        3,
    )
    assert report["tokens"] == 18 and report["all"]["tokens"] == 18
    assert set(report["all"]) >= {
        f"{k}/{s}" for k in ("ratio", "logratio") for s in ("mean", "p50", "p90", "p99", "p99.9", "max")
    }
    assert report["all"]["ratio/max"] > 0  # bf16 decoding vs an fp32-island trainer cannot agree exactly
    rc, det = _gap(
        capsys,
        "--init",
        "random",
        "--config",
        model_yaml,
        "--train-policy",
        "bf16",
        "--rollout-policy",
        "bf16",
        "--deterministic",
    )
    assert rc == 0 and det["all"]["ratio/max"] == 0.0 and det["deterministic"] is True


def test_check_gap_cli_checkpoint(capsys, tmp_path):
    uri = save_model(open_store(f"file://{tmp_path}/store"), "m", tiny_model("float32"))
    rc, report = _gap(capsys, "--checkpoint", uri, "--train-policy", "fp32", "--rollout-policy", "fp32")
    assert rc == 0 and report["source"] == uri and report["all"]["ratio/max"] < 1e-3


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--init", "random", "--train-policy", "fp32", "--rollout-policy", "bf16", "--deterministic"],
            "one policy",
        ),
        (["--checkpoint", "file:///nonexistent/ckpt", "--config", "x.yaml"], "--config goes with --init"),
        (["--init", "random", "--length-edges", "64,32"], "increasing"),
        (["--init", "random", "--config", "/nonexistent.yaml"], "no such file"),
    ],
)
def test_check_gap_cli_bad_input_exits_2(capsys, args, message):
    rc = main(["check", "gap", *args, "--samples", "2", "--max-new-tokens", "3"])
    assert rc == 2 and message in capsys.readouterr().err
