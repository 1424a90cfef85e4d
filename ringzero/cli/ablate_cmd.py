"""``ringzero ablate CONFIG --study NAME`` (one of the seed's four claims) or ``--vary KEY=A,B`` (any
setting): arms from the same base over seeds, side by side (ringzero.pipeline.ablate)."""

from __future__ import annotations

from pathlib import Path

from ringzero.cli.config_cmd import add_config_args


def register(sub) -> None:
    p = sub.add_parser("ablate", help="compare arms of one setting from the same base over seeds")
    add_config_args(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--study", help="a named study: loss, distill, depth or islands")
    what.add_argument("--vary", metavar="KEY=A,B", help="one arm per value of KEY (a --set path)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds of the stages after the base")
    p.add_argument("--through", help="--vary: the last stage each arm runs (default: the config's last)")
    p.add_argument(
        "--measure", help="--vary: comma-separated stages whose checkpoints are measured (default: --through)"
    )
    p.add_argument(
        "--out", default=None, help="where the arms' run folders and reports go (default: <run_dir>/ablate)"
    )
    p.set_defaults(handler=_ablate)


def _seeds(text: str) -> list[int]:
    from ringzero.errors import RingzeroError

    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise RingzeroError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise RingzeroError(f"--seeds {text!r}: expected distinct non-negative integers, e.g. 0,1")
    return seeds


def _study(args, cfg):
    from ringzero.errors import RingzeroError
    from ringzero.pipeline.studies import STUDIES, varied

    if args.study is not None:
        if args.study not in STUDIES:
            raise RingzeroError(f"--study {args.study!r}: choose one of {sorted(STUDIES)}")
        if args.through or args.measure:
            raise RingzeroError("--through and --measure go with --vary; a --study names its own stages")
        return STUDIES[args.study]
    key, sep, values = args.vary.partition("=")
    arms = [v for v in values.split(",") if v]
    if not sep or not key or len(arms) < 2:
        raise RingzeroError(f"--vary {args.vary!r}: expected KEY=A,B with at least two values")
    through = args.through or cfg.stages[-1].name
    measure = tuple(m for m in (args.measure or through).split(",") if m)
    return varied(key, arms, through, measure)


def _ablate(args) -> int:
    from ringzero.config import load_config
    from ringzero.logs import attach_run_log
    from ringzero.pipeline.ablate import print_study, run_study

    cfg = load_config(args.config, args.overrides)  # the run file itself is valid before any arm starts
    study = _study(args, cfg)
    out = Path(args.out) if args.out else Path(cfg.run.run_dir) / "ablate"
    attach_run_log(out / study.name)
    result = run_study(study, args.config, args.overrides, _seeds(args.seeds), out)
    print_study(study, result)
    print(f"\nreport: {out / study.name / 'report.html'}")
    return 0
