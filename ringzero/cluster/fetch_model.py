"""Copy a committed checkpoint from the store to a local folder: the rollout pod's init container.

    python -m ringzero.cluster.fetch_model s3://BUCKET/PREFIX/CKPT /models/policy --endpoint HOST:PORT

The folder it writes is a plain Hugging Face model folder (weights, index, ``config.json``, tokenizer
and generation files, none of the store's bookkeeping) that SGLang serves with ``--model-path``. Every
file is checked against the checkpoint's manifest, and the folder appears whole or not at all
(``CheckpointStore.export_folder``). A checkpoint without its ``COMMITTED`` marker is refused (a writer
may still be uploading it). Credentials come from ``RINGZERO_S3_ACCESS_KEY`` / ``RINGZERO_S3_SECRET_KEY``
or their ``*_FILE`` variants.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ringzero.errors import RingzeroError


def credential(name: str, environ=os.environ) -> str:
    if environ.get(name):
        return environ[name]
    path = environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    raise RingzeroError(f"set {name} or {name}_FILE (the S3 Secret is mounted by the chart)")


def fetch(uri: str, dest: Path, s3=None) -> list[str]:
    """Export the committed checkpoint at ``uri`` (``s3://`` or ``file://``) to ``dest``; returns the file
    names.

    ``s3`` is the ``S3Settings`` of an ``s3://`` store (defaults if ``None``).
    """
    from ringzero.store import open_store
    from ringzero.store.uri import parse_uri

    root, name = parse_uri(uri).parent()
    return open_store(str(root), s3).export_folder(name, dest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ringzero.cluster.fetch_model", description=__doc__.splitlines()[0]
    )
    p.add_argument("uri", help="the checkpoint: s3://BUCKET/PREFIX/NAME (or file://PATH/NAME)")
    p.add_argument("dest", type=Path, help="the folder to create; if it exists it must be empty")
    p.add_argument("--endpoint", help="host:port of the S3 API")
    p.add_argument("--secure", action="store_true")
    p.add_argument("--region", default=None)
    p.add_argument("--no-cert-check", action="store_true")
    args = p.parse_args(argv)
    try:
        names = fetch(args.uri, args.dest, _settings(args) if args.uri.startswith("s3://") else None)
    except RingzeroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"fetched {len(names)} files from {args.uri} to {args.dest}")
    return 0


def _settings(args):
    from pydantic import ValidationError

    from ringzero.store.config import S3Settings

    if not args.endpoint:
        raise RingzeroError(f"{args.uri}: give the S3 endpoint with --endpoint HOST:PORT")
    try:
        return S3Settings(
            endpoint=args.endpoint, secure=args.secure, region=args.region, cert_check=not args.no_cert_check
        )
    except ValidationError as exc:
        raise RingzeroError(f"bad S3 settings: {'; '.join(e['msg'] for e in exc.errors())}") from None


if __name__ == "__main__":
    sys.exit(main())
