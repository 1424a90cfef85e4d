"""Upload a compiled pipeline to the KFP API: the chart's post-install Job runs this after ``ringzero kfp
compile``.

    python -m ringzero.cluster.kfp_upload pipeline.yaml --host URL --name ringzero

The first upload creates the pipeline; later ones add a version named after the file's content hash,
so ``helm upgrade`` with unchanged configs is a no-op and a changed config shows up as a new version.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from ringzero.errors import RingzeroError


def version_name(name: str, package: Path) -> str:
    return f"{name}-{hashlib.sha256(package.read_bytes()).hexdigest()[:12]}"


def upload(client, package: Path, name: str, description: str = "") -> str:
    """Create the pipeline or add a version; returns what was done, for the Job's log."""
    version = version_name(name, package)
    pipeline_id = client.get_pipeline_id(name)
    if pipeline_id is None:
        client.upload_pipeline(str(package), pipeline_name=name, description=description or None)
        return f"created pipeline {name!r}"
    try:
        client.upload_pipeline_version(str(package), pipeline_version_name=version, pipeline_id=pipeline_id)
    except Exception as exc:
        # KFP answers a duplicate version name with a conflict: same content, nothing to do.
        if "already exist" in str(exc).lower() or "409" in str(exc):
            return f"pipeline {name!r} already has version {version!r}"
        raise
    return f"added version {version!r} to pipeline {name!r}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ringzero.cluster.kfp_upload", description=__doc__.splitlines()[0]
    )
    p.add_argument("package", type=Path, help="compiled pipeline YAML")
    p.add_argument("--host", required=True, help="KFP API URL, e.g. http://ml-pipeline.kubeflow:8888")
    p.add_argument("--name", required=True, help="pipeline name in the KFP UI")
    p.add_argument("--description", default="")
    p.add_argument("--token-file", default=None, help="service-account token for multi-user KFP")
    args = p.parse_args(argv)
    if not args.package.is_file():
        print(f"error: {args.package}: no such file (did `ringzero kfp compile` run?)", file=sys.stderr)
        return 2
    import kfp

    token = Path(args.token_file).read_text().strip() if args.token_file else None
    try:
        print(
            upload(
                kfp.Client(host=args.host, existing_token=token), args.package, args.name, args.description
            )
        )
    except RingzeroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
