"""The ``ringzero`` command line.

Each sub-command lives in its own module exposing ``register(subparsers)``; heavy imports
(torch, kfp) happen inside the handlers so ``ringzero config validate`` stays fast.
Logging is configured here, in ``main()``, never at import time.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ringzero.errors import RingzeroError

# Modules that contribute sub-commands, in the order they appear in --help.
COMMAND_MODULES = [
    "ringzero.cli.config_cmd",
    "ringzero.cli.store_cmd",
    "ringzero.cli.run_cmd",
    "ringzero.cli.ablate_cmd",
    "ringzero.cli.check_cmd",
    "ringzero.cli.gap_cmd",
    "ringzero.cli.cp_cmd",
    "ringzero.cli.kfp_cmd",
    "ringzero.cli.cluster_cmd",
    "ringzero.cli.serve_cmd",
    "ringzero.cli.model_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringzero",
        description="Zero RL with FP32 islands, per-layer-type context parallelism and staged runs.",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ringzero.logs import setup_logging

    setup_logging(level=args.log_level, run_dir=getattr(args, "log_dir", None))
    from ringzero.cli.launch_ranks import record_status

    code = _handle(args)
    record_status(code)
    return code


def _handle(args) -> int:
    try:
        return int(args.handler(args) or 0)
    except RingzeroError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
