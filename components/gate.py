"""The gate between stages: the stage's thresholds over its summary, as one plain boolean.

A boolean output (not a number or a string) because pipeline conditions compare it to ``true`` and the
local runner delivers numbers as floats.
"""

from kfp.dsl import Markdown, Output


def gate(run_config: str, stage_name: str, summary_json: str, reasons: Output[Markdown]) -> bool:
    """True when every threshold of the stage's gate holds; the reasons go to the Markdown output."""
    from ringzero.kfp.tasks import check_gate
    from ringzero.logs import setup_logging

    setup_logging()
    return check_gate(run_config, stage_name, summary_json, reasons)
