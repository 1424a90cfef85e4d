"""``ringzero check cp`` end to end, and what a failing rank does to a pool."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ringzero.cli.main import main
from ringzero.errors import RingzeroError
from ringzero.parallel.launch import RankPool

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.distributed


def ringzero(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ringzero.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_cp_json_at_cp3_with_uneven_length():
    out = ringzero(
        "check",
        "cp",
        "--layer",
        "lightning",
        "--strategy",
        "ring",
        "--cp",
        "3",
        "--seq-len",
        "20",
        "--dtype",
        "float32",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] and result["plan"] == {"lightning": "ring"}
    assert {"output", "input_grad", "grads"} <= set(result) and "query_key_value.weight" in result["grads"]
    assert result["max_abs"] < 1e-4
    assert [r["cp/lightning/steps_fwd"] for r in result["comm_per_rank"]] == [2, 2, 2]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--layer", "mla", "--strategy", "a2a", "--cp", "3", "--heads", "4"],
            "num_attention_heads % cp == 0",
        ),
        (["--layer", "lightning", "--strategy", "a2a"], "does not support lightning layers"),
        (["--layer", "model", "--strategy", "ring", "--sharding", "zigzag"], "needs contiguous shards"),
    ],
)
def test_refused_configurations_exit_2_with_the_reason(args, message, capsys):
    # In-process: a refusal happens before any rank is spawned.
    assert main(["check", "cp", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()  # rank 0 waits here for a peer that never comes


def test_a_failing_rank_tears_the_pool_down_instead_of_hanging():
    pool = RankPool(2, grace_s=1.0)
    start = time.monotonic()
    with pytest.raises(RingzeroError, match="rank 1 gives up"):
        pool.run(_fail_on_rank_1)
    assert not pool.alive
    assert time.monotonic() - start < 60
