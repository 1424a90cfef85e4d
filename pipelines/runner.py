"""Compile the staged pipeline, run it with the KFP local runner, or submit it to a KFP endpoint."""

import warnings
from pathlib import Path

from kfp import compiler

from pipelines.staged import build_pipeline
from ringzero.config.kfp import KfpSettings
from ringzero.config.run import RunConfig
from ringzero.errors import RingzeroError
from ringzero.pipeline.manifest import RunManifest


def compile_pipeline(cfg: RunConfig, settings: KfpSettings, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline_func=build_pipeline(cfg, settings), package_path=str(path))
    return path


def run_local(cfg: RunConfig, settings: KfpSettings, pipeline_root: Path) -> str:
    """Run every step as a subprocess of this interpreter; returns the run's final status from its manifest.

    Steps run their stages in-process whatever the config's mode: there is no cluster to launch on.
    """
    from kfp import local

    from ringzero.store import open_store

    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root), raise_on_error=False
    )
    pipeline = build_pipeline(cfg, settings.model_copy(update={"mode": "in-process"}))
    with warnings.catch_warnings():
        # The runner warns when an image name lacks "python"; it never uses the image, only this interpreter.
        warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
        # Display names and pod settings only matter on a cluster; the runner warns once per step.
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        pipeline()
    store = open_store(cfg.storage.root, cfg.storage.s3)
    manifest = store.get_json(RunManifest(cfg, store, Path(cfg.run.run_dir)).key) or {}
    return manifest.get("status", "unknown (no run manifest was written)")


def submit(
    cfg: RunConfig,
    settings: KfpSettings,
    host: str,
    experiment: str | None = None,
    namespace: str | None = None,
) -> str:
    """Create a run on the KFP API at ``host``; returns its run id."""
    if not cfg.storage.root.startswith("s3://"):
        raise RingzeroError(
            f"storage.root is {cfg.storage.root!r}: pipeline steps run in separate pods, which share no "
            "filesystem; give an s3:// store"
        )
    if settings.s3_secret is None:
        raise RingzeroError(
            "kfp.s3_secret is not set: the steps would have no credentials for the s3:// store"
        )
    import kfp

    try:
        client = kfp.Client(host=host, namespace=namespace)
        result = client.create_run_from_pipeline_func(
            build_pipeline(cfg, settings),
            arguments={},
            experiment_name=experiment,
            namespace=namespace,
            service_account=settings.service_account,
        )
    except Exception as exc:  # the client raises urllib3, ApiException and ValueError alike
        raise RingzeroError(f"KFP at {host}: could not submit run {cfg.run.name!r}: {exc}") from exc
    return result.run_id
