"""Kill a run mid-stage with SIGKILL and run it again: finished stages are reused, the interrupted one
resumes from its last committed checkpoint, and the run completes.

Real stage runners on a micro config; the RL runner only gains a test-only pause right after it
committed a chosen resume point (plugins/pipeline_hold_runners.py), so the kill lands at a known step.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from pipeline_kit import PLUGINS, log_events, manifest, real_micro_config

from ringzero.metrics import read_metrics
from ringzero.stages.base import TEST_RUNNERS_ENV

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resume")]

RL_STEPS = 5
HOLD_STEP = 2
GUARD_S = 300  # only against a hung child; nothing asserts on how long anything takes


def ringzero_run(config, env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ringzero.cli.main", "run", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (TEST_RUNNERS_ENV, "RINGZERO_TEST_HOLD_AT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def wait_for_resume_point(proc, run_dir, store, stage: str, step: int):
    """The committed resume point ``step`` of ``stage``; fails if the run ends before writing it."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (rc {proc.returncode}) before the kill:\n{proc.stdout.read()[-3000:]}"
            )
        starts = [
            e for e in log_events(run_dir) if e.get("event") == "stage.start" and e.get("stage") == stage
        ]
        if (
            starts
            and (marker := store / "stages" / starts[0]["hash"] / f"step-{step:06d}" / "COMMITTED").exists()
        ):
            return marker.parent
        time.sleep(0.05)
    pytest.fail(f"no resume point {step} of {stage} within the guard")


def test_a_killed_run_resumes_mid_stage_and_reuses_finished_stages(tmp_path):
    config = real_micro_config(tmp_path, RL_STEPS)
    run_dir, store = tmp_path / "run", tmp_path / "store"

    proc = ringzero_run(
        config,
        child_env(
            **{
                TEST_RUNNERS_ENV: "rl=pipeline_hold_runners:rl",
                "RINGZERO_TEST_HOLD_AT": f"stage1:{HOLD_STEP}",
            }
        ),
    )
    try:
        resume_point = wait_for_resume_point(proc, run_dir, store, "stage1", HOLD_STEP)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=GUARD_S)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    killed = manifest(run_dir)
    assert killed["status"] == "running" and [s["name"] for s in killed["stages"]] == ["base"]
    assert not (resume_point.parent / "outcome.json").exists()  # the stage never finished
    assert [r["step"] for r in read_metrics(run_dir / "stage1" / "metrics.jsonl")] == [1, 2]
    events_before = len(log_events(run_dir))

    rerun_started = time.time()
    rerun = ringzero_run(config, child_env())
    out, _ = rerun.communicate(timeout=GUARD_S)
    assert rerun.returncode == 0, out[-3000:]
    events = log_events(run_dir)[events_before:]
    named = [(e["event"], e.get("stage")) for e in events if e["event"].startswith("stage.")]
    assert named == [
        ("stage.cached", "base"),
        ("stage.start", "stage1"),
        ("stage.done", "stage1"),
        ("stage.start", "eval"),
        ("stage.done", "eval"),
    ]
    (resumed,) = [e for e in events if e["event"] == "rl.resume"]
    assert resumed["step"] == HOLD_STEP and resumed["uri"].endswith(f"step-{HOLD_STEP:06d}")
    # The rerun trained only the steps after the resume point (a record is logged after each step).
    rerun_steps = [
        r["step"] for r in read_metrics(run_dir / "stage1" / "metrics.jsonl") if r["time"] >= rerun_started
    ]
    assert rerun_steps == list(range(HOLD_STEP + 1, RL_STEPS + 1))
    done = manifest(run_dir)
    assert done["status"] == "succeeded"
    assert [(s["name"], s["skipped"]) for s in done["stages"]] == [
        ("base", True),
        ("stage1", False),
        ("eval", False),
    ]
    assert done["stages"][1]["steps"] == RL_STEPS
    assert (run_dir / "report.html").exists()
