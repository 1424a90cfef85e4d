"""Fault campaign: kill runs at random moments and at the store's commit points, rerun them, and count
what survived.

For each stage kind (pretrain, rl, distill, eval) a micro pipeline ends in a stage of that kind; the
stages before it are computed once into a prefix store, so every trial runs the target stage only:
1. copy the prefix store, start ``ringzero run``, kill it (SIGKILL at a uniformly random moment of the
   stage, or at a fault point: half-way through a shard write, just before a checkpoint's ``COMMITTED``
   marker, just before or after the stage outcome, during the run manifest; ``tests/faults/fault_points``);
2. inspect the store as a reader would: every committed checkpoint must verify by checksum (``torn``
   counts those that do not, or an outcome document that does not decode), and the newest committed
   resume point is noted;
3. rerun to the end: the run must succeed (``resumed``), resume from that newest resume point or reuse
   the committed outcome (``lost`` = committed steps it did not resume from, must be 0), and end with the
   same final checkpoint, bit for bit, as an uninterrupted run (``equal``; for eval the same summary).
Then the other faults, a few trials each: SIGTERM (the stage saves and exits within the grace period),
a full disk during a save (a clean failure; the previous checkpoint still verifies and the rerun
resumes), a corrupted shard (``ringzero store verify`` names it, the rerun refuses it), one rank of a
``--nproc 2`` job killed (the job ends within a bound and resumes), and the S3 server stopped and
restarted mid-run (moto's server in this process, which keeps its objects across the restart), for
outages shorter and longer than the store's retry budget.

    python tests/faults/fault_campaign.py --trials 20 --out tests/faults/results/faults.json # the full
    campaign python tests/faults/fault_campaign.py --trials 2 --kinds pretrain,rl # a short one python
    tests/faults/fault_campaign.py --trials 0 --others 0 --s3 3 # S3 outages only

Prints a Markdown table (trials, resumed, lost, torn, equal) and writes every trial's record as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
POINTS = ROOT / "tests" / "faults" / "fault_points"
GUARD_S = 600  # only against a hung child
MICRO_MODEL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layout": "LM",
    "intermediate_size": 64,
    "max_position_embeddings": 96,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "head_dim": 8,
    "lightning_block_size": 16,
}
BASE = {
    "name": "base",
    "kind": "pretrain",
    "steps": 24,
    "batch_size": 8,
    "seq_len": 48,
    "checkpoint_every": 4,
}
TARGETS = {
    "pretrain": {**BASE, "name": "target"},
    "rl": {
        "name": "target",
        "kind": "rl",
        "steps": 6,
        "prompts_per_step": 2,
        "samples_per_prompt": 2,
        "minibatches": 1,
        "checkpoint_every": 1,
        "min_steps": 0,
        "sampling": {"max_new_tokens": 12},
    },
    "distill": {
        "name": "target",
        "kind": "distill",
        "prompts": 16,
        "samples_per_prompt": 8,
        "epochs": 4,
        "batch_size": 4,
        "micro_batch": 4,
        "max_seq_len": 64,
        "sampling": {"max_new_tokens": 24},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
    },
    "eval": {
        "name": "target",
        "kind": "eval",
        "prompts": 8,
        "k": 2,
        "sampling": {"max_new_tokens": 12},
        "compare": ["base"],
    },
}
RESUME_EVENT = {"pretrain": "pretrain.resume", "rl": "rl.resume", "distill": "distill.resume"}


def config(
    root: Path, kind: str, with_target: bool = True, store: str | None = None, dp: int = 1, **run
) -> Path:
    base = (
        {**BASE, "steps": 300, "checkpoint_every": 100} if kind == "distill" else BASE
    )  # answers some right
    stages = ([] if kind == "pretrain" else [base]) + ([TARGETS[kind]] if with_target else [])
    data = {
        "run": {"name": "faults", "seed": 0, "run_dir": str(root / "run"), "threads": 1, **run},
        "model": MICRO_MODEL,
        "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 2, "eval_prompts": 4},
        "precision": {"train": "fp32", "rollout": "fp32"},
        "parallel": {"dp": dp, "cp": 1},
        "storage": {"root": store or f"file://{root / 'store'}"},
        "stages": stages,
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def child_env(fault: str | None = None, count: Path | None = None, extra_path: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGZERO_FAULT")}
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(POINTS), str(ROOT), os.environ.get("PYTHONPATH")])
        )
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env["RINGZERO_FAULT"] = fault
    if count:
        env["RINGZERO_FAULT_COUNT"] = str(count)
    return env


def forking() -> bool:
    return os.environ.get("RINGZERO_FAULTS_FORK", "1") != "0"


def _server():
    from fork_runs import fork_server

    return fork_server(ROOT, child_env())


def start(cfg: Path, env: dict, *extra: str):
    """A ``ringzero run`` in a session of its own: forked from a warm helper (``fork_runs``), or started as a
    fresh interpreter with ``RINGZERO_FAULTS_FORK=0``. Either way a separate process that a kill ends."""
    if forking():
        return _server().start(["run", str(cfg), *extra], env, ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "ringzero.cli.main", "run", str(cfg), *extra],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = GUARD_S) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def events(root: Path) -> list[dict]:
    path = root / "run" / "log.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by the kill
    return out


def target_hash(evs: list[dict]) -> str | None:
    for e in evs:
        if e.get("event") in ("stage.start", "stage.cached") and e.get("stage") == "target":
            return e.get("hash")
    return None


# -- what a reader sees in the store --------------------------------------------------------------------


def store_state(store_root: str, h: str | None) -> dict:
    """Committed checkpoints of the target stage verified by checksum; the newest resume point's step;
    whether its outcome exists and decodes."""
    from ringzero.errors import RingzeroError
    from ringzero.store import open_store

    store = open_store(store_root)
    if h is None:
        return {"torn": 0, "newest_step": 0, "outcome": False, "checkpoints": 0}
    torn, steps, n = 0, [], 0
    for uri in store.list(f"stages/{h[:16]}/"):
        n += 1
        try:
            store.verify(uri)
        except RingzeroError:
            torn += 1
        name = uri.rstrip("/").split("/")[-1]
        if name.startswith("step-"):
            steps.append(int(name.split("-")[1]))
    try:
        outcome = store.get_json(f"stages/{h[:16]}/outcome.json") is not None
    except RingzeroError:
        torn, outcome = torn + 1, False
    return {"torn": torn, "newest_step": max(steps, default=0), "outcome": outcome, "checkpoints": n}


def final_digest(store_root: str, h: str, kind: str) -> str:
    """The target's result: the final checkpoint's tensors (sha256 of their bytes), or eval's summary."""
    import hashlib

    from ringzero.store import open_store

    store = open_store(store_root)
    outcome = store.get_json(f"stages/{h[:16]}/outcome.json")
    if kind == "eval":
        return hashlib.sha256(json.dumps(outcome["summary"], sort_keys=True).encode()).hexdigest()
    import torch

    ckpt = store.load("stages/" + outcome["output_uri"].split("/stages/", 1)[1])  # also from a copied store
    digest = hashlib.sha256()
    for name in sorted(ckpt.tensors):
        digest.update(name.encode())
        digest.update(ckpt.tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# -- the campaign ---------------------------------------------------------------------------------------


@dataclass
class Reference:
    kind: str
    prefix: Path  # the store with the stages before the target
    digest: str
    stage_s: tuple[float, float]  # the target's start and end, seconds after the process started
    counts: dict[str, int]
    dp: int = 1

    def nproc(self) -> tuple[str, ...]:
        return ("--nproc", str(self.dp)) if self.dp > 1 else ()


@dataclass
class Trial:
    kind: str
    fault: str
    killed_at_s: float | None = None
    exit_code: int | None = None
    newest_step: int = 0
    outcome_before: bool = False
    torn: int = 0
    resumed: bool = False
    resumed_from: int | None = None
    lost: int = 0
    equal: bool = False
    rerun_exit: int | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def reference(kind: str, work: Path, dp: int = 1) -> Reference:
    """The uninterrupted run (``dp`` ranks) from a prefix store computed once per kind.

    The prefix (the stages before the target) runs on one process whatever ``dp``: a stage's identity does
    not include the layout, and every layout trains like one process (tests/parallel), so a ``dp`` run
    reuses it as committed."""
    nproc = ("--nproc", str(dp)) if dp > 1 else ()
    prefix = work / f"{kind}-prefix"
    if not prefix.exists():
        prefix.mkdir(parents=True)
        if kind != "pretrain":
            rc, out = finish(start(config(prefix, kind, with_target=False), child_env(extra_path=False)))
            if rc != 0:
                raise SystemExit(f"{kind}: the prefix run failed:\n{out[-3000:]}")
        else:
            (prefix / "store").mkdir()
    ref = work / f"{kind}-dp{dp}-reference"
    shutil.copytree(prefix / "store", ref / "store")
    counts_path = ref / "counts.json"
    if forking():
        _server()  # started before the clock: the stage's window is measured from the run's own start
    t0 = time.time()
    rc, out = finish(start(config(ref, kind, dp=dp), child_env(count=counts_path), *nproc))
    if rc != 0:
        raise SystemExit(f"{kind}: the reference run failed:\n{out[-3000:]}")
    evs = events(ref)
    start_s = (
        next(
            e["timestamp_s"]
            for e in map(_stamp, evs)
            if e.get("event") == "stage.start" and e.get("stage") == "target"
        )
        - t0
    )
    end_s = (
        next(
            e["timestamp_s"]
            for e in map(_stamp, evs)
            if e.get("event") == "stage.done" and e.get("stage") == "target"
        )
        - t0
    )
    h = target_hash(evs)
    return Reference(
        kind,
        prefix / "store",
        final_digest(f"file://{ref / 'store'}", h, kind),
        (start_s, end_s),
        json.loads(counts_path.read_text()) if counts_path.exists() else {},
        dp,
    )


def _stamp(e: dict) -> dict:
    from datetime import datetime

    ts = e.get("timestamp")
    return {**e, "timestamp_s": datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else 0.0}


def rerun_and_score(trial: Trial, ref: Reference, root: Path, before: dict) -> Trial:
    events_before = len(events(root))
    rc, out = finish(start(config(root, ref.kind, dp=ref.dp), child_env(extra_path=False), *ref.nproc()))
    trial.rerun_exit = rc
    trial.resumed = rc == 0
    if rc != 0:
        trial.note = out[-4000:]
        return trial
    new = events(root)[events_before:]
    trial.resumed_from, trial.lost, cached = resume_of(new, ref.kind, before["newest_step"])
    if cached:  # appended: a kill that lost the race says so, and its rerun reusing the outcome too
        trial.note = "; ".join(n for n in (trial.note, "outcome reused") if n)
    h = target_hash(new)
    trial.equal = final_digest(f"file://{root / 'store'}", h, ref.kind) == ref.digest
    return trial


def inspect_and_rerun(trial: Trial, ref: Reference, root: Path) -> Trial:
    """What a reader sees in the trial's file store after the fault, then the rerun; the folder removed."""
    before = store_state(f"file://{root / 'store'}", target_hash(events(root)))
    trial.newest_step, trial.outcome_before, trial.torn = (
        before["newest_step"],
        before["outcome"],
        before["torn"],
    )
    rerun_and_score(trial, ref, root, before)
    shutil.rmtree(root, ignore_errors=True)
    return trial


def resume_of(new: list[dict], kind: str, newest_step: int) -> tuple[int, int, bool]:
    """``(resumed_from, lost, cached)`` of a rerun from its log events: a reused outcome loses nothing."""
    cached = any(e.get("event") == "stage.cached" and e.get("stage") == "target" for e in new)
    resume = [e for e in new if e.get("event") == RESUME_EVENT.get(kind)]
    resumed_from = newest_step if cached else (resume[0]["step"] if resume else 0)
    return resumed_from, 0 if cached else max(0, newest_step - resumed_from), cached


def kill_trial(ref: Reference, work: Path, index: int, rng: random.Random, fault: str | None) -> Trial:
    root = work / f"{ref.kind}-{index:03d}"
    shutil.copytree(ref.prefix, root / "store")
    trial = Trial(ref.kind, fault or "random-time")
    t0 = time.monotonic()
    proc = start(config(root, ref.kind), child_env(fault=fault))
    if fault is None:
        lo, hi = ref.stage_s
        delay = rng.uniform(lo, hi)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        trial.killed_at_s = round(delay, 2)
    rc, _ = finish(proc)
    trial.exit_code = rc
    if rc == 0:
        trial.note = "finished before the kill"
    before = store_state(f"file://{root / 'store'}", target_hash(events(root)))
    trial.newest_step, trial.outcome_before, trial.torn = (
        before["newest_step"],
        before["outcome"],
        before["torn"],
    )
    trial.extra["seconds_to_death"] = round(time.monotonic() - t0, 2)
    rerun_and_score(trial, ref, root, before)
    shutil.rmtree(root, ignore_errors=True)
    return trial


def fault_points(ref: Reference, rng: random.Random) -> list[str]:
    """Every point the reference run passed, at a random occurrence of it."""
    out = []
    for point in ("shard", "commit", "outcome", "outcome-after", "manifest"):
        n = ref.counts.get({"outcome-after": "outcome"}.get(point, point), 0)
        if n:
            out.append(f"{point}:{rng.randint(1, n)}")
    return out


def wait_for_resume_point(proc: subprocess.Popen, root: Path, at_least: int = 1) -> bool:
    """Until the target stage has committed ``at_least`` resume points (its step loop is running); False if
    the run ended first."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline and proc.poll() is None:
        h = target_hash(events(root))
        if h and len(list((root / "store" / "stages" / h[:16]).glob("step-*/COMMITTED"))) >= at_least:
            return True
        time.sleep(0.05)
    return False


def resume_points(kind: str) -> int:
    """How many resume points the target stage of ``kind`` (one with steps) commits before its last step."""
    target = TARGETS[kind]
    return max(1, (target["steps"] - 1) // target.get("checkpoint_every", target["steps"]))


def sigterm_trial(
    ref: Reference,
    work: Path,
    index: int,
    rng: random.Random,
    grace_s: float = 20.0,
    delay_s: float | None = None,
) -> Trial:
    """SIGTERM once the step loop runs (after ``delay_s`` more, random when None): the stage must exit
    with 143 within the grace period; ``saved_on_signal`` when the loop saved a resume point for it."""
    root = work / f"{ref.kind}-term-{index:03d}"
    shutil.copytree(ref.prefix, root / "store")
    trial = Trial(ref.kind, "sigterm")
    proc = start(config(root, ref.kind, sigterm_grace_s=grace_s), child_env())
    t0 = time.monotonic()
    in_loop = wait_for_resume_point(proc, root)
    delay = rng.uniform(0.0, 0.3 * (ref.stage_s[1] - ref.stage_s[0])) if delay_s is None else delay_s
    try:
        if not in_loop:
            raise RuntimeError
        if delay > 0:
            proc.wait(timeout=delay)
            trial.note = "finished before the signal"
        else:
            raise subprocess.TimeoutExpired(proc.args, 0)
    except RuntimeError:
        trial.note = "finished before the loop"
        finish(proc)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        rc, _ = finish(proc, timeout=grace_s + 30)
        trial.extra["exit_s"] = round(time.monotonic() - sent, 2)
        trial.extra["within_grace"] = trial.extra["exit_s"] <= grace_s + 2
        trial.exit_code = rc
        evs = events(root)
        trial.extra["saved_on_signal"] = any(e.get("event", "").endswith(".preempted") for e in evs)
    trial.killed_at_s = round(time.monotonic() - t0, 2)
    return inspect_and_rerun(trial, ref, root)


def disk_full_trial(ref: Reference, work: Path, index: int, rng: random.Random) -> Trial:
    root = work / f"{ref.kind}-full-{index:03d}"
    shutil.copytree(ref.prefix, root / "store")
    n = ref.counts.get("shard", 0)
    k = rng.randint(2, n) if n >= 2 else 1
    trial = Trial(ref.kind, f"enospc:{k}")
    rc, out = finish(start(config(root, ref.kind), child_env(fault=f"enospc:{k}")))
    trial.exit_code = rc
    trial.extra["clean_error"] = rc == 2 and "No space left on device" in out and "Traceback" not in out
    return inspect_and_rerun(trial, ref, root)


def corrupt_trial(ref: Reference, work: Path, index: int, rng: random.Random) -> Trial:
    """Flip one byte of a shard of the newest resume point after a kill; verify must name the file and
    the rerun must refuse the checkpoint rather than train from it."""
    from ringzero.store import open_store

    root = work / f"{ref.kind}-corrupt-{index:03d}"
    shutil.copytree(ref.prefix, root / "store")
    trial = Trial(ref.kind, "corrupt-shard")
    proc = start(config(root, ref.kind), child_env())
    if wait_for_resume_point(proc, root):
        os.killpg(proc.pid, signal.SIGKILL)
    finish(proc)
    h = target_hash(events(root))
    store = open_store(f"file://{root / 'store'}")
    steps = (
        [u for u in store.list(f"stages/{h[:16]}/") if u.rstrip("/").split("/")[-1].startswith("step-")]
        if h
        else []
    )
    if not steps:
        trial.note = "no resume point to corrupt"
        shutil.rmtree(root, ignore_errors=True)
        return trial
    newest = sorted(steps)[-1]
    folder = root / "store" / newest.split("store/", 1)[1]
    shard = rng.choice(sorted(folder.glob("*.safetensors")))
    data = bytearray(shard.read_bytes())
    at = rng.randrange(len(data))
    data[at] ^= 0x40
    shard.write_bytes(bytes(data))
    verify = subprocess.run(
        [sys.executable, "-m", "ringzero.cli.main", "store", "verify", newest],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(extra_path=False),
    )
    trial.extra["verify_exit"] = verify.returncode
    trial.extra["verify_names_file"] = shard.name in (verify.stdout + verify.stderr)
    rc, out = finish(start(config(root, ref.kind), child_env(extra_path=False)))
    trial.rerun_exit = rc
    trial.extra["rerun_refused"] = rc != 0 and shard.name in out
    trial.equal = False
    shutil.rmtree(root, ignore_errors=True)
    return trial


def rank_kill_trial(
    ref: Reference, work: Path, index: int, rng: random.Random, grace_s: float = 20.0
) -> Trial:
    """``--nproc 2``: SIGKILL one rank mid-stage; the job must end within a bound and the rerun resume."""
    root = work / f"{ref.kind}-rank-{index:03d}"
    shutil.copytree(ref.prefix, root / "store")
    trial = Trial(ref.kind, "one-rank-killed")
    cfg = config(root, ref.kind, dp=ref.dp, sigterm_grace_s=grace_s)
    proc = start(cfg, child_env(extra_path=False), *ref.nproc())
    # Mid-stage by the run's own progress, after a random number of its resume points: a delay drawn from
    # the reference's window once landed after this run's faster stage had ended (the job then exits 0).
    wait_for_resume_point(proc, root, at_least=rng.randint(1, resume_points(ref.kind)))
    ranks = _rank_pids(proc.pid)
    if proc.poll() is None and ranks:
        victim = rng.choice(ranks)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        rc, _ = finish(proc, timeout=grace_s + 120)
        trial.extra["job_end_s"] = round(time.monotonic() - killed, 2)
        trial.exit_code = rc
    else:
        trial.note = "finished before the kill"
        finish(proc)
    return inspect_and_rerun(trial, ref, root)


def _rank_pids(root_pid: int) -> list[int]:
    """The training ranks under a ``--nproc`` launch: the leaf python processes of its tree."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    leaves, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        kids = children.get(pid, [])
        if not kids and pid != root_pid:
            leaves.append(pid)
        todo.extend(kids)
    return leaves


class MotoS3:
    """An S3 server on a thread of this process (moto): its objects live in this process, so they survive
    a stop and restart of the server, as a real server's disks do."""

    def __init__(self):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self.keys = {"RINGZERO_S3_ACCESS_KEY": "faults-access", "RINGZERO_S3_SECRET_KEY": "faults-secret-key"}
        self.server = None
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.start()

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        inner = self.server._server
        self.server.stop()
        inner.server_close()  # new connections fail at once, as with a dead server

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=f"http://{self.endpoint}",
            region_name="us-east-1",
            aws_access_key_id=self.keys["RINGZERO_S3_ACCESS_KEY"],
            aws_secret_access_key=self.keys["RINGZERO_S3_SECRET_KEY"],
        )

    def upload(self, folder: Path, bucket: str, prefix: str) -> None:
        client = self.client()
        client.create_bucket(Bucket=bucket)
        for path in folder.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                client.put_object(
                    Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder)}", Body=path.read_bytes()
                )


def s3_restart_trial(
    ref: Reference,
    work: Path,
    index: int,
    rng: random.Random,
    s3: MotoS3,
    down_s: float | None,
    backoff: dict | None = None,
) -> Trial:
    """The S3 server stopped for ``down_s`` seconds while the stage runs, then started again (its data
    kept): the run must retry and finish, or fail with a clear error; either way nothing half-written
    may be visible, and a rerun ends where an uninterrupted run ends. ``backoff`` overrides the store's
    retry settings (``storage.s3``: ``max_retries``, ``backoff_base_s``, ``backoff_max_s``): a shorter
    budget lets a shorter outage prove the same thing.

    ``down_s=None`` keeps the server down until the run exits: an outage longer than the retry budget
    whatever the run was doing when it began. (A fixed outage only a little longer than the budget is
    ridden out when the run spends part of it computing without touching the store.)"""
    root = work / f"{ref.kind}-s3-{index:03d}"
    root.mkdir(parents=True)
    bucket = f"faults-{ref.kind}-{index}"
    s3.upload(ref.prefix, bucket, "runs")
    store = f"s3://{bucket}/runs"
    settings = {"endpoint": s3.endpoint, "secure": False, **(backoff or {})}
    trial = Trial(ref.kind, "s3-down-until-exit" if down_s is None else f"s3-down-{down_s:g}s")
    cfg = config(root, ref.kind, store=store)
    data = yaml.safe_load(cfg.read_text())
    data["storage"]["s3"] = settings
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**child_env(extra_path=False), **s3.keys}
    proc = start(cfg, env)
    lo, hi = ref.stage_s
    time.sleep(rng.uniform(lo, lo + 0.6 * (hi - lo)))
    s3.stop()
    if down_s is None:
        rc, out = finish(proc)
        s3.start()
    else:
        time.sleep(down_s)
        s3.start()
        rc, out = finish(proc)
    trial.exit_code = rc
    trial.extra["finished"] = rc == 0
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    trial.extra["clean_error"] = rc == 0 or (rc == 2 and bool(lines) and "Traceback" not in out)
    if lines:
        trial.note = lines[-1][:200]
    os.environ.update(s3.keys)
    from ringzero.store import open_store
    from ringzero.store.config import S3Settings

    def reader():
        return open_store(store, S3Settings(**settings))

    h = target_hash(events(root))
    torn, steps = 0, []
    if h:
        for uri in reader().list(f"stages/{h[:16]}/"):
            try:
                reader().verify(uri)
            except Exception:  # noqa: BLE001 - any failure to verify counts as torn
                torn += 1
            if uri.rstrip("/").split("/")[-1].startswith("step-"):
                steps.append(int(uri.rstrip("/").split("-")[-1]))
    trial.torn, trial.newest_step = torn, max(steps, default=0)
    events_before = len(events(root))
    rc2, out2 = finish(start(cfg, env))
    trial.rerun_exit, trial.resumed = rc2, rc2 == 0
    if rc2 == 0:
        new = events(root)[events_before:]
        trial.resumed_from, trial.lost, _ = resume_of(new, ref.kind, trial.newest_step)
        h = target_hash(new)
        digest_store = root / "copy"
        client = s3.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="runs/"):
            for o in page.get("Contents", []):
                dest = digest_store / o["Key"][len("runs/") :]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
        trial.equal = final_digest(f"file://{digest_store}", h, ref.kind) == ref.digest
    else:
        trial.note = out2[-400:]
    shutil.rmtree(root, ignore_errors=True)
    return trial


FAULT_NAMES = {
    "random-time": "SIGKILL, random moment",
    "shard": "SIGKILL mid-shard write",
    "commit": "SIGKILL before COMMITTED",
    "outcome": "SIGKILL before the outcome",
    "outcome-after": "SIGKILL after the outcome",
    "manifest": "SIGKILL at the run manifest",
    "sigterm": "SIGTERM",
    "enospc": "disk full mid-save",
    "corrupt-shard": "corrupted shard",
    "one-rank-killed": "1 of 2 ranks SIGKILLed",
}


def _detail(fault: str, ts: list[Trial]) -> str:
    """What the fault-specific checks saw, over the group's trials."""
    n = len(ts)
    if fault == "sigterm":
        signalled = [t for t in ts if "exit_s" in t.extra]
        return (
            f"{sum(t.extra['within_grace'] for t in signalled)}/{len(signalled)} exited 143 within the grace "
            f"(max {max((t.extra['exit_s'] for t in signalled), default=0):.1f} s); "
            f"{sum(t.extra['saved_on_signal'] for t in signalled)} saved a resume point for the signal"
        )
    if fault == "enospc":
        return f"{sum(t.extra.get('clean_error', False) for t in ts)}/{n} failed with a clear error (exit 2)"
    if fault == "corrupt-shard":
        return (
            f"verify named the file {sum(t.extra.get('verify_names_file', False) for t in ts)}/{n}; "
            f"rerun refused it {sum(t.extra.get('rerun_refused', False) for t in ts)}/{n}"
        )
    if fault == "one-rank-killed":
        ends = [t.extra["job_end_s"] for t in ts if "job_end_s" in t.extra]
        return f"the job ended {max(ends, default=0):.1f} s after the kill at most"
    if fault.startswith("s3-down"):
        return (
            f"finished {sum(t.extra.get('finished', False) for t in ts)}/{n}, failed cleanly "
            f"{sum(not t.extra.get('finished', False) and t.extra.get('clean_error', False) for t in ts)}/{n}"
        )
    reused = sum("outcome reused" in t.note for t in ts)
    return f"{reused} reused a committed outcome" if reused else ""


def table(trials: list[Trial]) -> str:
    rows = [
        "| stage kind | fault | trials | rerun succeeded | committed steps lost | torn reads | equal final | "
        "checks |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    groups: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.kind, t.fault.split(":")[0]), []).append(t)
    order = list(FAULT_NAMES)
    for (kind, fault), ts in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], order.index(kv[0][1]) if kv[0][1] in order else 99, kv[0][1]),
    ):
        name = FAULT_NAMES.get(fault, fault.replace("s3-down-", "S3 down "))
        rows.append(
            f"| {kind} | {name} | {len(ts)} | {sum(t.resumed for t in ts)} | {sum(t.lost for t in ts)} | "
            f"{sum(t.torn for t in ts)} | {sum(t.equal for t in ts)} | {_detail(fault, ts)} |"
        )
    return "\n".join(rows)


def s3_campaign(kinds: list[str], trials: int, seed: int, work: Path) -> list[Trial]:
    """``trials`` outages per kind of each length: shorter than the store's retry budget (the run
    should ride it out) and longer (it should fail cleanly)."""
    rng = random.Random(seed + 1)
    s3 = MotoS3()
    out = []
    for kind in kinds:
        ref = reference(kind, work)
        for i in range(trials):
            for down_s in (3.0, 60.0):
                t = s3_restart_trial(ref, work, 2 * i + (down_s > 10), rng, s3, down_s)
                out.append(t)
                print(
                    f"  {kind} {t.fault}: {t.extra} resumed={t.resumed} lost={t.lost} torn={t.torn} "
                    f"equal={t.equal} "
                    f"{t.note[:120]}",
                    flush=True,
                )
        shutil.rmtree(ref.prefix.parent, ignore_errors=True)
    return out


def campaign(kinds: list[str], trials: int, seed: int, work: Path, others: int) -> list[Trial]:
    rng = random.Random(seed)
    out: list[Trial] = []
    for kind in kinds:
        ref = reference(kind, work)
        print(
            f"{kind}: reference stage {ref.stage_s[0]:.1f}-{ref.stage_s[1]:.1f} s, writes {ref.counts}",
            flush=True,
        )
        points = fault_points(ref, rng)
        for i in range(trials):
            # every fault point once per round of trials, random moments for the rest
            fault = points[i % len(points)] if points and i % 2 == 1 else None
            t = kill_trial(ref, work, i, rng, fault)
            out.append(t)
            print(
                f"  {kind} {t.fault}: resumed={t.resumed} lost={t.lost} torn={t.torn} equal={t.equal} "
                f"{t.note[:80]}",
                flush=True,
            )
        if kind == "eval":
            continue
        for i in range(others):
            for make in (sigterm_trial, disk_full_trial, corrupt_trial):
                t = make(ref, work, i, rng)
                out.append(t)
                print(
                    f"  {kind} {t.fault}: {t.extra} resumed={t.resumed} lost={t.lost} torn={t.torn} "
                    f"equal={t.equal}",
                    flush=True,
                )
        if kind == "rl":
            ref2 = reference(kind, work, dp=2)
            for i in range(others):
                t = rank_kill_trial(ref2, work, i, rng)
                out.append(t)
                print(
                    f"  {kind} {t.fault}: {t.extra} resumed={t.resumed} lost={t.lost} torn={t.torn}",
                    flush=True,
                )
        shutil.rmtree(ref.prefix.parent, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20, help="kill trials per stage kind")
    p.add_argument("--others", type=int, default=3, help="trials of each other fault per stage kind")
    p.add_argument("--kinds", default="pretrain,rl,distill,eval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--s3", type=int, default=0, help="S3 outage trials of each length per stage kind (moto)")
    p.add_argument("--out", type=Path, help="write every trial's record here (JSON)")
    p.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="no trials: print the table of these records and write it into BENCHMARKS.md",
    )
    args = p.parse_args()
    if args.report:
        from mdsection import write_section

        trials = [Trial(**r) for path in args.report for r in json.loads(path.read_text())]
        body = table(trials)
        print(body)
        write_section(ROOT / "BENCHMARKS.md", "faults", body)
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        kinds = args.kinds.split(",")
        trials = (
            campaign(kinds, args.trials, args.seed, Path(tmp), args.others)
            if args.trials or args.others
            else []
        )
        if args.s3:
            trials += s3_campaign([k for k in kinds if k != "eval"], args.s3, args.seed, Path(tmp) / "s3")
    print(table(trials))
    print(f"\n{len(trials)} trials in {(time.time() - started) / 60:.1f} min")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
