"""``ringzero check ...``: self-checks a user runs after every engine or kernel change.

This module owns the ``check`` parser. To add ``ringzero check NAME`` from another module, give that
module a ``register(sub)`` that calls ``check_subcommands(sub)`` (it returns the ``check`` parser's
sub-command action, creating ``check`` on first use) and adds its parser there, then list the module
in ``COMMAND_MODULES`` in ``ringzero/cli/main.py``::

    from ringzero.cli.check_cmd import check_subcommands

    def register(sub):
        p = check_subcommands(sub).add_parser("gap", help="...")
        p.add_argument(...)
        p.set_defaults(handler=_gap)

Handlers print a JSON object with ``--json`` (a short line otherwise) and return 1 past tolerance.
"""

from __future__ import annotations

import argparse
import json


def check_subcommands(sub):
    """The ``check`` parser's sub-parsers action, shared by every module that adds a check."""
    parser = sub.choices.get("check")
    if parser is None:
        parser = sub.add_parser(
            "check", help="self-checks: decoding forms, train/rollout gap, context parallelism"
        )
        parser.checks = parser.add_subparsers(dest="check_command", metavar="CHECK")
        parser.checks.required = True
    return parser.checks


def register(sub) -> None:
    p = check_subcommands(sub).add_parser(
        "decode",
        help="parallel (training) form vs decoding forms on random weights",
        description="Runs one left-padded batch through the parallel form and through token-by-token and "
        "chunked-prefill decoding; prints the max abs/rel error; exits 1 past the dtype's tolerance.",
    )
    p.add_argument("--layer", choices=["mla", "lightning", "model"], default="model")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML: a run config (its model section is used) or a bare model section",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seq-len", type=int, default=None, help="columns per row (default 2 Lightning blocks + 5)"
    )
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(handler=_decode)


def model_config_from_file(path: str):
    """A run config's ``model`` section, or a file that is only a model section."""
    from pathlib import Path

    from pydantic import ValidationError

    from ringzero.config.loader import load_config, read_yaml
    from ringzero.errors import ConfigError
    from ringzero.model.config import ModelConfig

    if not Path(path).is_file():
        raise ConfigError(path, ["no such file"])
    data = read_yaml(Path(path).read_text(), path)
    if "run" in data:
        return load_config(path).model
    try:
        return ModelConfig.model_validate(data.get("model", data))
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or '<top level>'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(path, problems) from None


def _decode(args: argparse.Namespace) -> int:
    from ringzero.model.config import ModelConfig
    from ringzero.model.decode_check import check_decode

    cfg = model_config_from_file(args.config) if args.config else ModelConfig()
    result = check_decode(args.layer, args.dtype, cfg, seed=args.seed, seq_len=args.seq_len)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        verdict = "ok" if result["ok"] else "FAIL"
        print(
            f"{verdict}: check decode {args.layer} {args.dtype}: max abs {result['max_abs']:.3e}, "
            f"max rel {result['max_rel']:.3e} (atol {result['atol']:g}, rtol {result['rtol']:g})"
        )
    return 0 if result["ok"] else 1
