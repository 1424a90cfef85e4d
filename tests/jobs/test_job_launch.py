"""A staged run as one multi-rank job, started the way users start it: ``ringzero run CONFIG --nproc N``.

Each test runs the real command line in a subprocess (torchrun, gloo ranks over loopback) on the
micro config next to this file: the whole pipeline at dp=2 x cp=2; a rank killed mid-stage ends the
job within a bounded time and a rerun resumes from the last committed step; a second job on the same
stage is refused while the rerun holds it, and the rerun finishes untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringzero.errors import IntegrityError
from ringzero.store import open_store
from ringzero.store.documents import decode_document
from ringzero.store.lease import LeaseRecord

pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("jobs")]

CONFIG = Path(__file__).with_name("micro-run.yaml")
KILL_DEADLINE_S = 60.0
"""How long a job may take to end after one of its ranks is killed (torchrun notices within seconds)."""


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_job_outlives_its_test():
    """Whatever a failed test left running is killed, ranks included (each in a session of its own)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            signal_job(proc, signal.SIGKILL)
            proc.wait()


def signal_job(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the job's process group and to every process below it: torchrun starts each rank in a
    session of its own, so the job's group alone would leave the ranks running."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, below = [proc.pid], []
    while todo:
        kids = parents.get(todo.pop(), [])
        below += kids
        todo += kids
    os.killpg(proc.pid, sig)
    for pid in below:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def start(tmp_path: Path, *extra: str, nproc: int = 2) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "ringzero.cli.main",
        "run",
        str(CONFIG),
        "--nproc",
        str(nproc),
        "--set",
        f"run.run_dir={tmp_path}/run",
        "--set",
        f"storage.root=file://{tmp_path}/store",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 240.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"job did not finish within {timeout:.0f} s:\n{out[-4000:]}")
    return proc.returncode, out


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        found += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return found


def rank_pid(proc: subprocess.Popen, rank: int) -> int | None:
    for pid in descendants(proc.pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_WORLD_SIZE=2" in env:
            return pid
    return None


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()) is not None:
            return value
        if proc.poll() is not None:
            pytest.fail(f"job ended (status {proc.returncode}) before {what}:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {what}")


def committed_steps(tmp_path: Path) -> list[str]:
    store = open_store(f"file://{tmp_path}/store")
    return [u for u in store.list("stages/") if "/step-" in u]


def manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "manifest.json").read_text())


def test_the_whole_pipeline_runs_as_one_dp2_cp2_job(tmp_path):
    status, out = finish(start(tmp_path, "--set", "parallel.dp=2", "--set", "parallel.cp=2", nproc=4))
    assert status == 0, out[-4000:]
    doc = manifest(tmp_path)
    assert doc["status"] == "succeeded"
    assert [s["name"] for s in doc["stages"]] == ["base", "stage1", "distill", "eval"]
    # Rank 0 alone wrote the run folder's files; every other rank kept its own log.
    logs = sorted(p.name for p in (tmp_path / "run").glob("log*.jsonl"))
    assert logs == ["log.jsonl", "log.rank1.jsonl", "log.rank2.jsonl", "log.rank3.jsonl"]
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert {e.get("rank") for e in events if "rank" in e} == {0}


def test_parallel_dims_that_do_not_match_the_ranks_are_refused(tmp_path):
    status, out = finish(start(tmp_path, "--set", "parallel.dp=2", "--set", "parallel.cp=2", nproc=2))
    assert status == 2  # refused before torchrun starts a rank (inside a job, from_env refuses the same)
    assert "--nproc 2: the config's parallel.dp x parallel.cp = 2 x 2 = 4 ranks" in out


def held_mid_base(tmp_path: Path, proc: subprocess.Popen) -> Path | None:
    """The lease of a stage that holds a committed resume point and no outcome yet (base, mid-stage), when one
    of ``proc``'s processes holds it (not the dead rank of a killed job, whose lease a rerun takes over)."""
    for held in (tmp_path / "store").glob("stages/*/lease.json"):
        if not any(held.parent.glob("step-*")) or (held.parent / "outcome.json").exists():
            continue
        try:
            pid = LeaseRecord.from_doc(decode_document(held.read_bytes(), str(held)), str(held)).pid
        except (OSError, IntegrityError):
            continue  # replaced while read
        if pid in (proc.pid, *descendants(proc.pid)):
            return held
    return None


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_a_rerun_resumes_and_a_second_job_meanwhile_is_refused(tmp_path):
    """One long base at dp 2, killed and rerun: the rerun is also the live holder a second job on the same
    stage meets (one 150-step job saved against a test of its own)."""
    long_base = (
        "--set",
        "stages.base.steps=150",  # 140 steps after the first resume point: the kill lands mid-base
        "--set",
        "stages.base.checkpoint_every=10",
        "--set",
        "parallel.dp=2",
    )
    proc = start(tmp_path, *long_base)
    wait_for(lambda: committed_steps(tmp_path) or None, 180, "a committed resume point", proc)
    victim = wait_for(lambda: rank_pid(proc, 1), 30, "rank 1's process", proc)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    status, out = finish(proc, timeout=KILL_DEADLINE_S + 30)
    assert status != 0
    assert time.monotonic() - killed_at < KILL_DEADLINE_S, "the job outlived its dead rank"
    steps = committed_steps(tmp_path)
    assert steps, "the killed job left no committed resume point"

    rerun = start(tmp_path, *long_base)
    # Stopped mid-base (its lease taken over from the dead job, steps still to run) while the second job
    # starts, the rerun meets the second as a live holder however fast it would have finished (a stop that
    # landed after the stage's outcome made the second a cache hit, exit 0).
    wait_for(lambda: held_mid_base(tmp_path, rerun), 180, "the rerun holding the base stage's lease", rerun)
    signal_job(rerun, signal.SIGSTOP)
    try:
        assert held_mid_base(tmp_path, rerun) is not None, "the rerun was not mid-base when it was stopped"
        second = start(tmp_path, *long_base, "--set", f"run.run_dir={tmp_path}/second")
        second_status, second_out = finish(second)
    finally:
        signal_job(rerun, signal.SIGCONT)
    assert second_status == 2, second_out[-4000:]
    assert "is being run by another job" in second_out

    status, out = finish(rerun, timeout=400)
    assert status == 0, out[-4000:]
    assert manifest(tmp_path)["status"] == "succeeded"
    resumed = [
        json.loads(line)
        for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()
        if '"pretrain.resume"' in line
    ]
    assert resumed and resumed[-1]["step"] >= 10, "the rerun started over instead of resuming"
    store = open_store(f"file://{tmp_path}/store")
    for uri in store.list("stages/"):
        store.verify(uri)  # every committed checkpoint is whole: nothing the refused job touched
