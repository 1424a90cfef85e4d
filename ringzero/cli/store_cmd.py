"""``ringzero store ls|latest|gc|verify URI``: look after a checkpoint store from the shell.

S3 settings come from a run config (``--config RUN.yaml``, its ``storage.s3`` section) or from
``--endpoint/--secure/--region``; credentials, as always, only from the environment.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("store", help="list, verify and clean checkpoint stores")
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION")
    ssub.required = True

    ls = ssub.add_parser("ls", help="print the URIs of the committed checkpoints under a store root")
    _add_common(ls, "store root: file://PATH or s3://BUCKET/PREFIX")
    ls.add_argument("--prefix", default="", help="only names starting with this")
    ls.set_defaults(handler=_ls)

    latest = ssub.add_parser("latest", help="print the URI of the most recently committed checkpoint")
    _add_common(latest, "store root: file://PATH or s3://BUCKET/PREFIX")
    latest.add_argument("--prefix", default="", help="only names starting with this")
    latest.set_defaults(handler=_latest)

    gc = ssub.add_parser("gc", help="delete checkpoints that were started but never committed")
    _add_common(gc, "store root: file://PATH or s3://BUCKET/PREFIX")
    gc.add_argument(
        "--min-age",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="spare folders written to more recently than this (give a margin if a save may be running)",
    )
    gc.set_defaults(handler=_gc)

    verify = ssub.add_parser("verify", help="check every file of a checkpoint against its manifest")
    _add_common(verify, "checkpoint URI")
    verify.set_defaults(handler=_verify)


def _add_common(p: argparse.ArgumentParser, uri_help: str) -> None:
    p.add_argument("uri", metavar="URI", help=uri_help)
    p.add_argument(
        "--config", metavar="RUN.yaml", help="take the S3 settings from this run config's storage.s3"
    )
    p.add_argument("--endpoint", metavar="HOST:PORT", help="S3 endpoint (without a scheme)")
    p.add_argument("--secure", action="store_true", default=None, help="use TLS")
    p.add_argument("--region", help="S3 region, if the server needs one")


def _s3_settings(args):
    from pydantic import ValidationError

    from ringzero.errors import StoreError
    from ringzero.store.config import S3Settings

    if args.config:
        from ringzero.config import load_config

        base = load_config(args.config).storage.s3.model_dump()
    else:
        base = {}
    flags = {"endpoint": args.endpoint, "secure": args.secure, "region": args.region}
    try:
        return S3Settings(**{**base, **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as exc:
        problems = "; ".join(f"--{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise StoreError(f"bad S3 settings: {problems}") from None


def _open(args, uri: str):
    from ringzero.store import open_store

    return open_store(uri, _s3_settings(args) if uri.startswith("s3://") else None)


def _ls(args) -> int:
    for uri in _open(args, args.uri).list(args.prefix):
        print(uri)
    return 0


def _latest(args) -> int:
    from ringzero.errors import StoreError

    uri = _open(args, args.uri).latest(args.prefix)
    if uri is None:
        raise StoreError(
            f"no committed checkpoint under {args.uri}"
            + (f" with prefix {args.prefix!r}" if args.prefix else "")
        )
    print(uri)
    return 0


def _gc(args) -> int:
    result = _open(args, args.uri).gc_uncommitted(min_age_s=args.min_age)
    for uri in result.checkpoints:
        print(f"removed {uri}")
    print(
        f"gc: {len(result.checkpoints)} uncommitted checkpoints ({result.objects} objects), "
        f"{result.partial_writes} interrupted writes removed"
    )
    return 0


def _verify(args) -> int:
    from ringzero.store.uri import parse_uri

    root, name = parse_uri(args.uri).parent()
    manifest = _open(args, str(root)).verify(name)
    n_tensors = sum(len(e.tensors) for e in manifest.files.values())
    n_bytes = sum(e.size for e in manifest.files.values())
    print(
        f"ok: {args.uri}: {len(manifest.files)} files, {n_tensors} tensors, {n_bytes} bytes, every sha256 "
        "matches"
    )
    return 0
