"""A stage's identity: the hash of everything that determines its output.

Two stages with equal hashes produce interchangeable outputs, so a re-run (or another run with the
same upstream settings, e.g. the one-time pretrained base) reuses the committed result. The stage's
name and its gate thresholds are excluded: renaming a stage or tightening a gate reruns nothing.
"""

from __future__ import annotations

from ringzero.config.loader import config_hash
from ringzero.config.run import RunConfig, stage_view
from ringzero.stages.base import StageInputs

IDENTITY_VERSION = 1  # bump when a stage's semantics change in a way the config cannot show

UNSAID = {
    "task": {
        "min_digits": None,
        "short_fraction": 0.0,
        "verbosity": "trace",
        "check_weights": None,
        "slip_rate": 0.0,
        "slip_from": 1,
        "check_order": "forward",
        "check_verbosity": "drawn",
        "terse_form": "restated",
    },
    "task/jsonl": {"eval_prompts": 128},
    "stage/rl": {"rollback": None, "forced_opening": None, "tier_penalty": None, "anchor": None},
    "stage/rl/forced_opening": {"answer": "policy", "tiers": None},
    "stage/distill": {"select": "shortest"},
}
"""Fields added after identity version 1, with the values that reproduce the earlier behaviour: they enter
the hash only when set otherwise, so a store's committed stages (the one-time base) keep their identity.
Add a field here with its old behaviour's value whenever a field is added to a task or a stage."""


def said(fields: dict, where: str) -> dict:
    unsaid = UNSAID.get(where, {})
    return {k: v for k, v in fields.items() if not (k in unsaid and v == unsaid[k])}


def stage_fields(stage) -> dict:
    """The stage's settings as its identity reads them: not its name, gate, seed, precision or inputs (they
    enter otherwise or not at all), and no added field at its old behaviour's value."""
    exclude = {"name", "gate", "seed", "precision", "init", "reference", "compare"}
    fields = said(stage.model_dump(mode="json", exclude=exclude), f"stage/{stage.kind}")
    if isinstance(fields.get("forced_opening"), dict):
        fields["forced_opening"] = said(fields["forced_opening"], "stage/rl/forced_opening")
    return fields


def stage_hash(cfg: RunConfig, stage, inputs: StageInputs) -> str:
    """Input checkpoints enter by URI: stage outputs live under their producer's identity
    (``stages/<hash>/final``), so a URI already names everything upstream, for the local runner and a
    pipeline step alike. A stage's own ``seed`` and ``precision`` enter as the run's would
    (``stage_view``): only what the stage runs under counts, not where it was said."""
    cfg = stage_view(cfg, stage)

    return config_hash(
        {
            "version": IDENTITY_VERSION,
            "seed": cfg.run.seed,
            "model": cfg.model.model_dump(mode="json"),
            "tokenizer": cfg.tokenizer.model_dump(mode="json"),
            "task": said(said(cfg.task.model_dump(mode="json"), "task"), f"task/{cfg.task.kind}"),
            "precision": cfg.precision.model_dump(mode="json"),
            "engines": {"training": cfg.engines.training.kind, "rollout": cfg.engines.rollout.kind},
            "stage": stage_fields(stage),
            "init": inputs.init_uri,
            "reference": inputs.reference_uri,
            "base": inputs.base_uri,
            "compare": dict(sorted(inputs.compare.items())),
        }
    )
