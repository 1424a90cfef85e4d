"""``--nproc N``: run this very command as N local ranks of one job, through torchrun itself.

The command re-executes under ``python -m torch.distributed.run --standalone --nproc-per-node N``
with ``--nproc`` removed, so each rank sees torchrun's environment (``RANK``, ``WORLD_SIZE``, ...) and
joins the job (``ringzero.parallel.runtime.from_env``). torchrun stops every rank when one fails,
so a dead rank ends the job instead of leaving the others waiting in a collective. torchrun reports
any failure as status 1, so each rank also records its own exit status (``record_status``) and the
job's status is rank 0's (2 for bad input, 3 for a failed gate), or torchrun's when rank 0 recorded
none (it was killed). Inside a job already (``WORLD_SIZE`` set) ``--nproc`` must match it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ringzero.errors import RingzeroError


def add_nproc_arg(p) -> None:
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="start N local ranks through torchrun (gloo on CPU, NCCL on CUDA); must equal "
        "parallel.dp x parallel.cp x engines.training.tp x engines.training.pp",
    )


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs ``ringzero <argv>`` (``--nproc`` already stripped) on ``nproc``
    ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "-m",
        "ringzero.cli.main",
        *argv,
    ]


def strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = i + 1 < len(argv)
            continue
        if arg.startswith("--nproc="):
            continue
        out.append(arg)
    return out


def relaunch(nproc: int | None, argv: list[str] | None = None) -> int | None:
    """Start the job through torchrun and return its exit status; None when this process should do the
    work itself (no ``--nproc``, one rank, or already a rank of a job)."""
    if nproc is None:
        return None
    if nproc < 1:
        raise RingzeroError(f"--nproc must be >= 1 (got {nproc})")
    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world != nproc:
            raise RingzeroError(f"--nproc {nproc} inside a job of WORLD_SIZE={world}")
        return None
    if nproc == 1:
        return None
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks talk over loopback
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    argv = strip_nproc(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="ringzero-ranks-") as status_dir:
        env[STATUS_DIR_ENV] = status_dir
        code = subprocess.call(torchrun_argv(nproc, argv), env=env)
        rank0 = Path(status_dir) / "rank-0"
        return int(rank0.read_text()) if code and rank0.exists() else code


STATUS_DIR_ENV = "RINGZERO_RANK_STATUS_DIR"


def record_status(code: int) -> None:
    """Inside a job started by ``relaunch``: leave this rank's exit status for the launcher to read."""
    folder, rank = os.environ.get(STATUS_DIR_ENV), os.environ.get("RANK")
    if folder and rank is not None:
        (Path(folder) / f"rank-{rank}").write_text(str(code))
