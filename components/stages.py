"""One lightweight component per stage kind.

Their bodies are copied into the compiled pipeline and run in the step's image, so they only import
ringzero (inside the body) and hand over to ``ringzero.kfp.tasks.run_stage``. The signatures differ
by what a kind consumes: RL stages take a KL reference, eval takes the checkpoints it compares;
pretraining and distillation share one (both are next-token training, told apart by ``stage_kind``).
Each writes its summary (Markdown), its metrics and the run report so far (HTML) for the UI.
Empty strings stand for "no checkpoint" (pipeline parameters cannot be null).
"""

from typing import NamedTuple

from kfp.dsl import HTML, Markdown, Metrics, Output

# The return annotation is spelled out in every signature: the body is run without this module's globals.


def lm_stage(
    run_config: str,
    stage_name: str,
    stage_kind: str,
    mode: str,
    run_id: str,
    init_uri: str,
    base_uri: str,
    metrics: Output[Metrics],
    summary: Output[Markdown],
    report: Output[HTML],
) -> NamedTuple("StageOutputs", [("checkpoint_uri", str), ("summary_json", str)]):
    """A next-token stage (``stage_kind``): pretraining the base on the task's corpus, or self-distillation
    (fine-tuning on the input policy's shortest correct samples)."""
    from ringzero.kfp.tasks import run_stage
    from ringzero.logs import setup_logging

    setup_logging()
    return run_stage(
        run_config,
        stage_name,
        stage_kind,
        mode,
        run_id,
        init_uri=init_uri,
        base_uri=base_uri,
        metrics=metrics,
        summary=summary,
        html_report=report,
    )


def rl_stage(
    run_config: str,
    stage_name: str,
    mode: str,
    run_id: str,
    init_uri: str,
    base_uri: str,
    reference_uri: str,
    metrics: Output[Metrics],
    summary: Output[Markdown],
    report: Output[HTML],
) -> NamedTuple("StageOutputs", [("checkpoint_uri", str), ("summary_json", str)]):
    """One RL stage (stage 1, stage 2 or tier RL) from the input policy, KL to the reference."""
    from ringzero.kfp.tasks import run_stage
    from ringzero.logs import setup_logging

    setup_logging()
    return run_stage(
        run_config,
        stage_name,
        "rl",
        mode,
        run_id,
        init_uri=init_uri,
        base_uri=base_uri,
        reference_uri=reference_uri,
        metrics=metrics,
        summary=summary,
        html_report=report,
    )


def eval_stage(
    run_config: str,
    stage_name: str,
    mode: str,
    run_id: str,
    init_uri: str,
    base_uri: str,
    compare_uris: dict,
    metrics: Output[Metrics],
    summary: Output[Markdown],
    report: Output[HTML],
) -> NamedTuple("StageOutputs", [("checkpoint_uri", str), ("summary_json", str)]):
    """Evaluate the input policy and compare the named stages' checkpoints (stage name -> URI)."""
    from ringzero.kfp.tasks import run_stage
    from ringzero.logs import setup_logging

    setup_logging()
    return run_stage(
        run_config,
        stage_name,
        "eval",
        mode,
        run_id,
        init_uri=init_uri,
        base_uri=base_uri,
        compare_uris=compare_uris,
        metrics=metrics,
        summary=summary,
        html_report=report,
    )
