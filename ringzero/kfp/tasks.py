"""What each pipeline step runs inside its pod: a stage, a gate, or the final-status record.

Every step is its own process, so each one parses the run config it is handed, opens the store and
continues the run manifest there. Values cross step boundaries as plain strings and booleans: an
empty string stands for "no checkpoint", because pipeline parameters cannot be null.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import structlog
import yaml

from ringzero.cluster.job import stage_args
from ringzero.config.kfp import stage_pod_rank_problem
from ringzero.config.loader import parse_config
from ringzero.config.run import RunConfig
from ringzero.errors import ConfigError, RingzeroError
from ringzero.kfp import report
from ringzero.kfp.manifest import open_run_manifest
from ringzero.pipeline.execute import ExecutedStage, execute_stage, outcome_key
from ringzero.pipeline.gates import evaluate_gate
from ringzero.pipeline.identity import stage_hash
from ringzero.stages import preemption
from ringzero.stages.base import StageInputs

log = structlog.get_logger(__name__)

MODES = ("in-process", "cluster")


def config_text(cfg: RunConfig) -> str:
    """The config as the pipeline carries it: one line of JSON holding only what was set.

    One line, because the compiler copies parameter defaults into a comment header that a multi-line
    string would break; only what was set, so new defaults elsewhere do not churn the compiled spec.
    """
    text = json.dumps(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":"))
    if parse_config_text(text) != cfg:
        raise RingzeroError("the run config does not survive a JSON round trip; the pipeline cannot carry it")
    return text


def parse_config_text(text: str) -> RunConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("run_config", [f"not JSON: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            "run_config", [f"top level must be an object of sections, got {type(data).__name__}"]
        )
    return parse_config(data, "run_config")


def run_stage(
    run_config: str,
    stage_name: str,
    kind: str,
    mode: str,
    run_id: str,
    *,
    init_uri: str,
    base_uri: str,
    reference_uri: str = "",
    compare_uris: dict | None = None,
    metrics=None,
    summary=None,
    html_report=None,
) -> tuple[str, str]:
    """Run (or reuse) one stage; returns (checkpoint URI or "", summary as JSON) and fills the artifacts."""
    if mode not in MODES:
        raise RingzeroError(f"mode {mode!r}: expected one of {MODES}")
    cfg = parse_config_text(run_config)
    stage = _stage(cfg, stage_name, kind)
    inputs = StageInputs(
        init_uri=init_uri or None,
        reference_uri=reference_uri or None,
        base_uri=base_uri or None,
        compare=dict(compare_uris or {}),
    )
    store = _open_store(cfg)
    run_dir = Path(cfg.run.run_dir)
    if mode == "in-process":
        # the step pod is the stage's process: a pod deletion saves a resume point as `ringzero run` does
        with preemption.installed(cfg.run.sigterm_grace_s):
            ex = _execute_in_process(cfg, store, stage, inputs, run_dir)
    else:
        ex = _execute_on_cluster(cfg, store, stage, inputs, run_dir)
    manifest = open_run_manifest(cfg, store, run_dir, run_id)
    manifest.record(ex)
    _log_metrics(metrics, ex.outcome.summary)
    _write(summary, report.stage_markdown(ex))
    _write(html_report, report.run_report_html(cfg, store, manifest.doc))
    return ex.outcome.output_uri or "", json.dumps(ex.outcome.summary, sort_keys=True)


def check_gate(run_config: str, stage_name: str, summary_json: str, reasons=None) -> bool:
    """The stage's gate over its summary, as a plain bool (pipeline conditions compare it to ``true``)."""
    cfg = parse_config_text(run_config)
    stage = _stage(cfg, stage_name, None)
    result = evaluate_gate(stage.gate, json.loads(summary_json))
    _write(reasons, report.gate_markdown(stage_name, result))
    if not result.passed:
        log.error("gate.failed", stage=stage_name, reasons=result.reasons)
    return bool(result.passed)


def record_final_status(
    run_config: str, run_id: str, state: str, error: str | None, summary=None, html_report=None
) -> str:
    """Finish the run manifest: gate_failed if a gate stopped the run, else the pipeline's own final state;
    then evaluate the run's targets over the stages it recorded (reported only, the status stays)."""
    cfg = parse_config_text(run_config)
    store = _open_store(cfg)
    manifest = open_run_manifest(cfg, store, Path(cfg.run.run_dir), run_id)
    stages = manifest.doc["stages"]
    if any(not s["gate"]["passed"] for s in stages):
        status = "gate_failed"
    elif state == "SUCCEEDED":
        status = "succeeded"
    else:
        status = state.lower()  # failed, cancelled
    manifest.doc["error"] = error or None
    manifest.finish(status)
    # After the status is safe: the targets read every stage's outcome and metrics back from the store.
    result = report.run_result(cfg, store, manifest.doc)
    manifest.record_targets(result.targets)
    _write(
        summary,
        report.status_markdown(cfg.run.name, status, stages, error) + report.targets_markdown(result.targets),
    )
    _write(html_report, report.run_report_html(cfg, store, manifest.doc, result))
    log.info("run.finished", run=cfg.run.name, status=status)
    return status


def _stage(cfg: RunConfig, name: str, kind: str | None):
    try:
        stage = cfg.stage(name)
    except KeyError:
        raise RingzeroError(
            f"stage {name!r} is not in the run config (stages: {[s.name for s in cfg.stages]})"
        ) from None
    if kind is not None and stage.kind != kind:
        raise RingzeroError(f"stage {name!r} is a {stage.kind} stage; this step runs {kind} stages")
    return stage


def _open_store(cfg: RunConfig):
    from ringzero.store import open_store

    return open_store(cfg.storage.root, cfg.storage.s3)


def _seed(cfg: RunConfig) -> None:
    import torch

    from ringzero.model.vector_math import set_threads

    if cfg.run.threads:
        set_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)


def _execute_in_process(cfg: RunConfig, store, stage, inputs: StageInputs, run_dir: Path) -> ExecutedStage:
    """The stage in this step's pod, with one local rank per GPU the pod requests (``kfp.stage_pod.gpus``).

    One rank runs right here. G > 1 ranks run as ``ringzero stage run ... --nproc G``, which re-executes
    itself under torchrun with G local ranks and commits the outcome under the same stage identity;
    ``execute_stage`` then finds that outcome and returns it without running anything.
    """
    problem = stage_pod_rank_problem(
        cfg.kfp.stage_pod, cfg.parallel.dp, cfg.parallel.cp, cfg.engines.training.tp, cfg.engines.training.pp
    )
    if problem:
        raise ConfigError("run_config", [problem])
    ranks = cfg.kfp.stage_pod.local_ranks()
    if ranks == 1:
        _seed(cfg)
        return execute_stage(cfg, store, stage, inputs, run_dir)
    key = outcome_key(stage_hash(cfg, stage, inputs))
    if store.get_json(key) is None:
        with tempfile.TemporaryDirectory(prefix="ringzero-stage-") as tmp:
            config = Path(tmp) / "config.yaml"
            config.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
            argv = [
                sys.executable,
                "-m",
                "ringzero.cli.main",
                "stage",
                "run",
                str(config),
                "--stage",
                stage.name,
                *stage_args(inputs),
                "--nproc",
                str(ranks),
            ]
            log.info("stage.ranks", stage=stage.name, nproc=ranks)
            code = _run_command(argv)
        # 3: the stage ran and committed, and its gate failed; the gate step decides what that means.
        if code not in (0, 3):
            raise RingzeroError(
                f"stage {stage.name!r}: `ringzero stage run --nproc {ranks}` exited with {code}"
            )
        if store.get_json(key) is None:
            # Checked before execute_stage, which would otherwise run the stage again here, as one rank.
            raise RingzeroError(
                f"stage {stage.name!r}: `ringzero stage run --nproc {ranks}` committed no outcome ({key})"
            )
    return execute_stage(cfg, store, stage, inputs, run_dir)


def _run_command(argv: list[str]) -> int:
    return subprocess.run(argv, check=False).returncode


def _execute_on_cluster(cfg, store, stage, inputs, run_dir) -> ExecutedStage:
    """The stage as a training job on the cluster; same signature and result as ``execute_stage``.

    Imported here: only cluster mode needs the launcher and its Kubernetes client.
    """
    from ringzero.cluster import execute_stage_on_cluster

    return execute_stage_on_cluster(cfg, store, stage, inputs, run_dir)


def _log_metrics(metrics, summary: dict) -> None:
    """Scalars the UI can show; non-finite values stay in the Markdown summary, which prints them."""
    if metrics is None:
        return
    for key, value in sorted(summary.items()):
        if isinstance(value, bool | int | float) and math.isfinite(value):
            metrics.log_metric(key, float(value))


def _write(artifact, text: str) -> None:
    if artifact is not None:
        Path(artifact.path).parent.mkdir(parents=True, exist_ok=True)
        Path(artifact.path).write_text(text)
