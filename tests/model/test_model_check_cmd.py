"""``ringzero check decode`` end to end, and the registry other checks plug into."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from ringzero.cli.check_cmd import check_subcommands
from ringzero.cli.main import main

RUN_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"

SMALL = {
    "vocab_size": 32,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layer_group_size": 2,
    "intermediate_size": 24,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 4,
    "v_head_dim": 4,
    "head_dim": 4,
    "partial_rotary_factor": 1.0,
    "lightning_block_size": 4,
}


@pytest.mark.parametrize("layer", ["mla", "lightning", "model"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_check_decode_reports_within_tolerance(tmp_path, capsys, layer, dtype):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"model": SMALL}))
    rc = main(["check", "decode", "--layer", layer, "--dtype", dtype, "--config", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    assert out["layer"] == layer and out["dtype"] == dtype and out["seq_len"] == 13
    assert set(out["forms"]) == {"token_by_token", "chunked_prefill"}
    assert 0 <= out["max_abs"] <= out["atol"] + out["rtol"] * 100
    assert out["atol"] == (1e-10 if dtype == "float64" else 1e-4)


def test_check_decode_fails_past_tolerance(monkeypatch, capsys):
    """A decoding path that drifts must turn the exit status non-zero."""
    from ringzero.model import lightning

    real_step = lightning.lightning_step

    def drifting_step(q, k, v, log_decay, state, *args, **kwargs):
        o, state = real_step(q, k, v, log_decay, state, *args, **kwargs)
        return o * (1 + 1e-3), state

    monkeypatch.setattr(lightning, "lightning_step", drifting_step)
    rc = main(["check", "decode", "--layer", "lightning", "--dtype", "float64", "--seq-len", "9"])
    assert rc == 1 and capsys.readouterr().out.startswith("FAIL")


def test_check_decode_reads_a_run_config(capsys):
    rc = main(["check", "decode", "--layer", "mla", "--config", str(RUN_CONFIG), "--seq-len", "6"])
    assert rc == 0 and capsys.readouterr().out.startswith("ok: check decode mla float64")


def test_bad_config_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"model": {**SMALL, "num_attention_heads": 0}}))
    assert main(["check", "decode", "--config", str(path)]) == 2
    assert "num_attention_heads" in capsys.readouterr().err


def test_other_modules_share_the_check_parser():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    first = check_subcommands(sub)
    first.add_parser("gap").set_defaults(handler="gap")
    assert check_subcommands(sub) is first
    assert parser.parse_args(["check", "gap"]).handler == "gap"


def test_check_decode_covers_a_moe_model(tmp_path, capsys):
    """Cached decoding routes each new token alone; its experts and output equal the parallel form's."""
    moe = {**SMALL, "num_experts": 4, "n_group": 2, "topk_group": 1, "moe_intermediate_size": 8}
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({"model": moe}))
    rc = main(["check", "decode", "--layer", "model", "--dtype", "float64", "--config", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True and out["max_abs"] < 1e-12


def test_fp64_lightning_check_is_fp64_accurate_on_two_threads_every_time():
    """A report had this check flip between 4.7e-15 and 1.82e-8 (fp32-like) from run to run on two threads.
    Each fresh process must give the same fp64-level error."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    cmd = [
        sys.executable,
        "-m",
        "ringzero.cli.main",
        "check",
        "decode",
        "--layer",
        "lightning",
        "--dtype",
        "float64",
        "--json",
    ]
    results = {
        json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)["max_abs"]
        for _ in range(4)
    }
    assert len(results) == 1 and results.pop() < 1e-12
