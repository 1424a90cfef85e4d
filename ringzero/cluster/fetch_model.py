"""Copy a committed checkpoint folder from S3 to a local folder: the rollout pod's init container.

    python -m ringzero.cluster.fetch_model s3://BUCKET/PREFIX/CKPT /models/policy --endpoint HOST:PORT

A folder without its ``COMMITTED`` marker is refused (a writer may still be uploading it). Credentials
come from ``RINGZERO_S3_ACCESS_KEY`` / ``RINGZERO_S3_SECRET_KEY`` or their ``*_FILE`` variants.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ringzero.errors import RingzeroError

COMMIT_MARKER = "COMMITTED"


def credential(name: str, environ=os.environ) -> str:
    if environ.get(name):
        return environ[name]
    path = environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    raise RingzeroError(f"set {name} or {name}_FILE (the S3 Secret is mounted by the chart)")


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise RingzeroError(f"expected s3://BUCKET/PREFIX, got {uri!r}")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket or not prefix.strip("/"):
        raise RingzeroError(f"expected s3://BUCKET/PREFIX with a non-empty prefix, got {uri!r}")
    return bucket, prefix.strip("/") + "/"


def fetch(client, uri: str, dest: Path) -> list[str]:
    """Download every object under the checkpoint prefix; returns the relative names written."""
    bucket, prefix = split_s3_uri(uri)
    objects = [o for o in client.list_objects(bucket, prefix=prefix, recursive=True) if not o.is_dir]
    names = {o.object_name[len(prefix):]: o for o in objects}
    if COMMIT_MARKER not in names:
        raise RingzeroError(f"{uri} has no {COMMIT_MARKER} marker: not a finished checkpoint")
    dest.mkdir(parents=True, exist_ok=True)
    for rel, obj in sorted(names.items()):
        target = dest / rel
        if dest.resolve() not in target.resolve().parents:
            raise RingzeroError(f"{uri}: object name {rel!r} escapes the destination folder")
        client.fget_object(bucket, obj.object_name, str(target))
        if target.stat().st_size != obj.size:
            raise RingzeroError(f"{uri}/{rel}: got {target.stat().st_size} bytes, the store lists {obj.size}")
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ringzero.cluster.fetch_model", description=__doc__.splitlines()[0])
    p.add_argument("uri")
    p.add_argument("dest", type=Path)
    p.add_argument("--endpoint", required=True, help="host:port of the S3 API")
    p.add_argument("--secure", action="store_true")
    p.add_argument("--region", default=None)
    p.add_argument("--no-cert-check", action="store_true")
    args = p.parse_args(argv)
    from minio import Minio

    client = Minio(args.endpoint, access_key=credential("RINGZERO_S3_ACCESS_KEY"),
                   secret_key=credential("RINGZERO_S3_SECRET_KEY"), secure=args.secure, region=args.region,
                   cert_check=not args.no_cert_check)
    try:
        names = fetch(client, args.uri, args.dest)
    except RingzeroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"fetched {len(names)} files from {args.uri} to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
