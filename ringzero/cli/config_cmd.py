"""``ringzero config validate|show|schema``."""

from __future__ import annotations

import argparse
import json
import sys


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The run-file argument and ``--set`` overrides, shared by every command that takes a run config."""
    p.add_argument("config", help="run config YAML")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field, e.g. --set stages.stage1.steps=10 (repeatable; VALUE is YAML)",
    )


def register(sub) -> None:
    p = sub.add_parser("config", help="validate, show or describe run configs")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True

    v = csub.add_parser("validate", help="validate a run config and its overrides")
    add_config_args(v)
    v.set_defaults(handler=_validate)

    s = csub.add_parser("show", help="print the fully resolved config (defaults filled in) as YAML")
    add_config_args(s)
    s.set_defaults(handler=_show)

    j = csub.add_parser("schema", help="print the JSON Schema of run configs")
    j.set_defaults(handler=_schema)


def _validate(args) -> int:
    from ringzero.config import config_hash, load_config

    cfg = load_config(args.config, args.overrides)
    stages = " -> ".join(f"{s.name}({s.kind})" for s in cfg.stages) or "(no stages)"
    print(f"ok: {args.config}: run {cfg.run.name!r}, {len(cfg.stages)} stages: {stages}")
    print(f"config hash {config_hash(cfg)[:16]}")
    return 0


def _show(args) -> int:
    import yaml

    from ringzero.config import load_config

    cfg = load_config(args.config, args.overrides)
    yaml.safe_dump(cfg.model_dump(mode="json"), sys.stdout, sort_keys=False)
    return 0


def _schema(args) -> int:
    from ringzero.config.run import RunConfig

    print(json.dumps(RunConfig.model_json_schema(), indent=2))
    return 0
