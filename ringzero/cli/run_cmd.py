"""``ringzero run CONFIG`` (the whole staged run) and ``ringzero stage run`` (one stage, as a cluster job runs
it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ringzero.cli.config_cmd import add_config_args
from ringzero.cli.launch_ranks import add_nproc_arg, relaunch


def register(sub) -> None:
    p = sub.add_parser("run", help="run every configured stage in order (skips stages already committed)")
    add_config_args(p)
    p.add_argument(
        "--force", action="append", default=[], metavar="STAGE", help="rerun this stage even if cached"
    )
    add_nproc_arg(p)
    p.set_defaults(handler=_run)

    s = sub.add_parser("stage", help="run one stage of a config (what each pipeline step executes)")
    ssub = s.add_subparsers(dest="stage_command", metavar="ACTION")
    ssub.required = True
    r = ssub.add_parser("run", help="run one named stage with explicit input URIs")
    add_config_args(r)
    r.add_argument("--stage", required=True, help="stage name in the config")
    r.add_argument("--init", default=None, help="input checkpoint URI")
    r.add_argument("--reference", default=None, help="KL reference checkpoint URI (RL stages)")
    r.add_argument("--base", default=None, help="the run's pretrained base URI")
    r.add_argument(
        "--compare", action="append", default=[], metavar="NAME=URI", help="eval: checkpoints to compare"
    )
    r.add_argument(
        "--result", default=None, help="write the stage result (outputs, summary, gate) as JSON here"
    )
    add_nproc_arg(r)
    r.set_defaults(handler=_stage_run)


def open_run(args):
    """Load the config, join the job torchrun describes (if any), attach the run log, seed, and open
    the store: shared by every training command. Returns ``(cfg, store, run_dir, runtime)``."""
    import torch

    from ringzero.config import load_config
    from ringzero.logs import attach_run_log, quiet_for_rank
    from ringzero.model.vector_math import set_threads
    from ringzero.parallel.runtime import from_env
    from ringzero.stages import preemption
    from ringzero.store import open_store

    cfg = load_config(args.config, args.overrides)
    # SIGTERM (a pod deleted, torchrun stopping the survivors of a failed job): a step loop saves and
    # exits, anything else exits through Python so the stage lease and open files are released.
    preemption.install(cfg.run.sigterm_grace_s)
    runtime = from_env(
        cfg.parallel,
        cfg.run.device,
        tp=cfg.engines.training.tp,
        ep=cfg.engines.training.ep,
        pp=cfg.engines.training.pp,
    )
    run_dir = Path(cfg.run.run_dir)
    quiet_for_rank(runtime.rank)
    attach_run_log(run_dir, rank=runtime.rank)
    if cfg.run.threads:
        set_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    return cfg, open_store(cfg.storage.root, cfg.storage.s3), run_dir, runtime


def _preflight(args) -> None:
    """Before torchrun starts N ranks: the config loads and its degrees make N ranks, or the command stops
    here with one clear error (not the same error from every rank and torchrun's report after it)."""
    if args.nproc is None or args.nproc <= 1 or "WORLD_SIZE" in os.environ:
        return
    from ringzero.config import load_config
    from ringzero.errors import RingzeroError
    from ringzero.parallel.config import world_product

    cfg = load_config(args.config, args.overrides)
    training = cfg.engines.training
    names, values, need = world_product(cfg.parallel.dp, cfg.parallel.cp, training.tp, training.pp)
    if need != args.nproc:
        raise RingzeroError(
            f"--nproc {args.nproc}: the config's {names} = {values} = {need} ranks; start it "
            f"with --nproc {need} or set the degrees so that their product is {args.nproc}"
        )


def _run(args) -> int:
    _preflight(args)
    if (status := relaunch(args.nproc)) is not None:
        return status
    from ringzero.parallel.runtime import shutdown
    from ringzero.pipeline.local import run_pipeline
    from ringzero.pipeline.summary import print_summary, write_outputs

    cfg, store, run_dir, runtime = open_run(args)
    result = run_pipeline(cfg, store, run_dir, force=set(args.force), runtime=runtime)
    if runtime.is_main:
        print_summary(result)
        write_outputs(cfg, result, run_dir)
    shutdown(runtime)
    return 0 if result.status == "succeeded" else 3


def _stage_run(args) -> int:
    _preflight(args)
    if (status := relaunch(args.nproc)) is not None:
        return status
    from ringzero.errors import RingzeroError
    from ringzero.parallel.runtime import shutdown
    from ringzero.pipeline.execute import execute_stage
    from ringzero.stages.base import StageInputs

    cfg, store, run_dir, runtime = open_run(args)
    try:
        stage = cfg.stage(args.stage)
    except KeyError:
        raise RingzeroError(
            f"--stage {args.stage!r}: no such stage; stages: {[s.name for s in cfg.stages]}"
        ) from None
    compare = {}
    for item in args.compare:
        name, sep, uri = item.partition("=")
        if not sep:
            raise RingzeroError(f"--compare {item!r}: expected NAME=URI")
        compare[name] = uri
    # Resolved exactly as the local runner does, so a stage run here has the same identity.
    reference = (args.reference or args.init) if stage.kind == "rl" else None
    inputs = StageInputs(init_uri=args.init, reference_uri=reference, base_uri=args.base, compare=compare)
    ex = execute_stage(cfg, store, stage, inputs, run_dir, runtime=runtime)
    shutdown(runtime)
    if not runtime.is_main:
        return 0 if ex.gate.passed else 3
    result = {
        "stage": ex.name,
        "stage_hash": ex.stage_hash,
        "output_uri": ex.outcome.output_uri,
        "summary": ex.outcome.summary,
        "stop_reason": ex.outcome.stop_reason,
        "skipped": ex.skipped,
        "gate": ex.gate.to_dict(),
    }
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.result:
        Path(args.result).write_text(text)
    print(text)
    return 0 if ex.gate.passed else 3
