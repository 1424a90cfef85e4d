"""`ringzero run` completes a staged run with `engines.training.kind: megatron` on the CPU, in one
process (TP 1) and as a job of two ranks (TP 2, CP 2 on zigzag shards, and PP 2: two pipeline stages
under megatron's 1F1B schedule); its checkpoints are Ling 2.5
folders the torch engine loads, and the layouts end with the same weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from ringzero.model.checkpoint import load_model  # noqa: E402
from ringzero.model.tolerances import compare  # noqa: E402
from ringzero.store import open_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def run(tmp_path: Path, *extra: str) -> dict:
    store = f"file://{tmp_path / 'store'}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringzero.cli.main",
            "run",
            str(ROOT / "configs" / "micro-megatron.yaml"),
            "--set",
            f"storage.root={store}",
            "--set",
            f"run.run_dir={tmp_path / 'run'}",
            "--set",
            "stages.base.steps=8",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    s = open_store(store)
    finals = {uri.split("/")[-2]: uri for uri in s.list("stages/") if uri.endswith("/final")}
    return {"stderr": out.stderr, "store": s, "finals": finals}


def stage1_weights(r: dict) -> dict:
    [uri] = [u for u in r["finals"].values() if load_model(u, store=r["store"]).meta.get("stage") == "stage1"]
    return load_model(uri, store=r["store"]).model.state_dict()


def test_megatron_runs_the_stages_at_tp1_tp2_cp2_and_pp2_to_the_same_weights(tmp_path):
    one = run(tmp_path / "tp1")
    two = run(tmp_path / "tp2", "--nproc", "2", "--set", "engines.training.tp=2")
    cp = run(tmp_path / "cp2", "--nproc", "2", "--set", "parallel.cp=2", "--set", "parallel.sharding=zigzag")
    pp = run(tmp_path / "pp2", "--nproc", "2", "--set", "engines.training.pp=2")
    for r in (one, two, cp, pp):
        assert "stage.done" in r["stderr"] and r["stderr"].count("stage.done") >= 3
    a = stage1_weights(one)
    for label, other in (("tp2", two), ("cp2", cp), ("pp2", pp)):
        b = stage1_weights(other)
        assert a.keys() == b.keys()
        for name in a:
            check = compare(b[name].float(), a[name].float(), torch.float32)
            assert check["ok"], f"{label} {name}: {check}"
