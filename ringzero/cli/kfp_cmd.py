"""``ringzero kfp compile|run-local|submit``: the staged run as a Kubeflow pipeline.

The pipeline definitions (``pipelines/``, ``components/``) live in the source tree next to the
``ringzero`` package; these commands import them from there when they are not already importable.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from ringzero.cli.config_cmd import add_config_args
from ringzero.errors import RingzeroError


def register(sub) -> None:
    p = sub.add_parser("kfp", help="compile, run locally or submit the staged run as a Kubeflow pipeline")
    ksub = p.add_subparsers(dest="kfp_command", metavar="ACTION")
    ksub.required = True

    c = ksub.add_parser("compile", help="write the compiled pipeline YAML")
    add_config_args(c)
    c.add_argument("--output", type=Path, default=None, help="output file (default: RUN_NAME.yaml here)")
    _add_install_args(c)
    c.set_defaults(handler=_compile)

    r = ksub.add_parser("run-local", help="run the pipeline with the KFP local subprocess runner")
    add_config_args(r)
    r.add_argument(
        "--pipeline-root", type=Path, default=None, help="where step outputs go (default: RUN_DIR/kfp-local)"
    )
    r.set_defaults(handler=_run_local)

    s = ksub.add_parser("submit", help="submit a run to a KFP endpoint")
    add_config_args(s)
    s.add_argument(
        "--host",
        default=None,
        help="KFP API URL, e.g. http://localhost:8080 through a port-forward "
        "(default with --release: the release's pipeline.kfpHost, reachable from inside the cluster)",
    )
    s.add_argument("--experiment", default=None, help="experiment name (default: the endpoint's default)")
    s.add_argument("--namespace", default=None, help="namespace of a multi-user KFP install")
    _add_install_args(s)
    s.set_defaults(handler=_submit)


def _add_install_args(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--release",
        default=None,
        metavar="NAME",
        help="take the store, images, service account and cluster settings from this Helm release "
        "(its ConfigMaps, through the kubeconfig); CONFIG may then name one of its run configs",
    )
    where.add_argument(
        "--install",
        type=Path,
        default=None,
        metavar="DIR",
        help="the same from the release's cluster ConfigMap mounted at DIR (the upload Job)",
    )
    p.add_argument(
        "--release-namespace",
        default=None,
        metavar="NS",
        help="namespace of --release (default: the kubeconfig context's)",
    )


def pipelines_module(name: str):
    """Import ``pipelines.<name>``, from the source tree next to the ringzero package if need be."""
    try:
        return importlib.import_module(f"pipelines.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("pipelines", "components"):
            raise
    root = Path(__file__).resolve().parents[2]
    if not (root / "pipelines" / "__init__.py").is_file():
        raise RingzeroError(
            "ringzero kfp needs the source tree's pipelines/ and components/ folders; run it from a checkout "
            "(or put the checkout on PYTHONPATH)"
        )
    sys.path.insert(0, str(root))
    return importlib.import_module(f"pipelines.{name}")


def _install(args):
    from ringzero.kfp import install

    if args.install is not None:
        return install.from_dir(args.install)
    if args.release is not None:
        return install.from_release(args.release, args.release_namespace)
    if args.release_namespace is not None:
        raise RingzeroError("--release-namespace goes with --release")
    return None


def _load(args, installed=None):
    """The run config and its kfp settings; with a release's settings, as that release's pipeline runs it."""
    import tempfile

    from ringzero.kfp.settings import load_kfp_config

    if installed is None:
        return load_kfp_config(args.config, args.overrides)
    with tempfile.TemporaryDirectory(prefix="ringzero-run-config-") as scratch:
        path = installed.config_path(args.config, Path(scratch))
        return load_kfp_config(path, [*installed.overrides(Path(args.config).name), *args.overrides])


def _compile(args) -> int:
    cfg, settings = _load(args, _install(args))
    out = args.output or Path(f"{cfg.run.name}.yaml")
    pipelines_module("runner").compile_pipeline(cfg, settings, out)
    print(f"wrote {out}: pipeline {cfg.run.name!r}, {len(cfg.stages)} stages, mode {settings.mode}")
    return 0


def _run_local(args) -> int:
    cfg, settings = _load(args)
    root = args.pipeline_root or Path(cfg.run.run_dir) / "kfp-local"
    status = pipelines_module("runner").run_local(cfg, settings, root)
    print(f"run {cfg.run.name!r}: {status}")
    if status == "succeeded":
        return 0
    if status == "gate_failed":
        return 3  # as `ringzero run`: a gate stopped the run, no error in the tooling
    raise RingzeroError(f"run {cfg.run.name!r} ended {status}; the step logs above say why")


def _submit(args) -> int:
    installed = _install(args)
    cfg, settings = _load(args, installed)
    host = args.host or (installed.kfp_host if installed else None)
    if host is None:
        raise RingzeroError(
            "--host: the KFP API URL to submit to (or --release, whose pipeline.kfpHost is taken)"
        )
    run_id = pipelines_module("runner").submit(cfg, settings, host, args.experiment, args.namespace)
    account = f" as service account {settings.service_account}" if settings.service_account else ""
    print(f"submitted run {cfg.run.name!r} to {host}{account}: run id {run_id}")
    return 0
