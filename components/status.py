"""The exit handler's step: it always runs, and finishes the run manifest with the run's final status."""

from kfp.dsl import HTML, Markdown, Output, PipelineTaskFinalStatus


def record_status(
    run_config: str,
    run_id: str,
    status: PipelineTaskFinalStatus,
    summary: Output[Markdown],
    report: Output[HTML],
) -> str:
    """succeeded, gate_failed (a gate stopped the run), failed or cancelled; the report covers the whole
    run."""
    from ringzero.kfp.tasks import record_final_status
    from ringzero.logs import setup_logging

    setup_logging()
    return record_final_status(run_config, run_id, status.state, status.error_message, summary, report)
