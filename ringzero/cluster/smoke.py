"""Installation check run by ``helm test`` as a one-process-per-node training job.

It proves what a first run needs: the job's nodes rendezvous and all-reduce (NCCL on GPUs, gloo on
CPU), each node sees the GPUs it asked for, and the S3 bucket is reachable with the Secret's keys.
Rendezvous variables come from Kubeflow Trainer (``PET_*``) or the Training Operator (``MASTER_ADDR``...).
"""

from __future__ import annotations

import argparse
import os
import sys

from ringzero.cluster.fetch_model import credential
from ringzero.errors import RingzeroError


def rendezvous(environ) -> tuple[str, int, int, int]:
    """(master address, port, node rank, node count) from either operator's variables."""
    if "PET_MASTER_ADDR" in environ:
        keys = ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK", "PET_NNODES")
    else:
        keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    missing = [k for k in keys if k not in environ]
    if missing:
        raise RingzeroError(
            f"rendezvous variables {missing} are not set: is this running inside a training job?"
        )
    addr, port, rank, world = (environ[k] for k in keys)
    return addr, int(port), int(rank), int(world)


def check_allreduce(environ, expect_gpus: int) -> str:
    import torch
    import torch.distributed as dist

    addr, port, rank, world = rendezvous(environ)
    gpus = torch.cuda.device_count()
    if gpus < expect_gpus:
        raise RingzeroError(f"node {rank} sees {gpus} GPUs, expected {expect_gpus}: check the GPU operator")
    backend = "nccl" if expect_gpus else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", 0) if expect_gpus else torch.device("cpu")
        total = torch.ones(1, device=device)
        dist.all_reduce(total)
        if int(total.item()) != world:
            raise RingzeroError(f"all-reduce over {world} nodes summed to {total.item()}")
    finally:
        dist.destroy_process_group()
    return f"node {rank}/{world}: {backend} all-reduce ok, {gpus} GPUs visible"


def check_bucket(client, bucket: str) -> str:
    if not client.bucket_exists(bucket):
        raise RingzeroError(
            f"bucket {bucket!r} does not exist (the chart's bucket job creates it for bundled MinIO)"
        )
    return f"bucket {bucket!r} reachable"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ringzero.cluster.smoke", description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=0, help="GPUs each node must see")
    p.add_argument("--endpoint", required=True, help="host:port of the S3 API")
    p.add_argument("--bucket", required=True)
    p.add_argument("--secure", action="store_true")
    args = p.parse_args(argv)
    try:
        print(check_allreduce(os.environ, args.gpus))
        from minio import Minio

        client = Minio(
            args.endpoint,
            access_key=credential("RINGZERO_S3_ACCESS_KEY"),
            secret_key=credential("RINGZERO_S3_SECRET_KEY"),
            secure=args.secure,
        )
        print(check_bucket(client, args.bucket))
    except RingzeroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
