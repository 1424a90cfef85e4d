"""Stage identities stay put when the config schema grows: a knob added later enters the hash only when
it is set, so a store's committed base (pretrained once, reused by every later run) keeps its hash;
setting the knob gives a new identity."""

from pathlib import Path

import pytest
import yaml

from ringzero.config import load_config
from ringzero.config.loader import parse_config
from ringzero.pipeline.identity import UNSAID, stage_hash
from ringzero.stages.base import StageInputs

ADDED_TASK_FIELDS = UNSAID["task"]

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DIGITSUM = CONFIGS / "digitsum-cpu.yaml"  # the added knobs are the digit-sum task's
DIGITSUM_BASE_HASH = "4ec0b0d413cc249b"  # the digit-sum base since its corpus has checked traces
TINY = CONFIGS / "tiny-cpu.yaml"
TINY_BASE_HASH = "6dec12ef9d505fb4"  # the shipped row-search base, pretrained once per store
TINY_STAGE_HASHES = {  # every shipped stage, from no inputs: a stage field added later leaves them alone
    "base": "6dec12ef9d505fb4",
    "stage1": "4bc8f13a9e15026b",
    "distill": "1aaa8b9835a837dc",
    "stage2": "d8432b411c3d87d7",
    "tier": "4fdf5bb798ebaced",
    "eval": "90f273d78216e728",
}
KNOB_VALUES = {
    "min_digits": 4,
    "short_fraction": 0.2,
    "verbosity": "step",
    "check_weights": [0.5, 0.5],
    "slip_rate": 0.1,
    "slip_from": 2,
    "check_order": "reverse",
    "check_verbosity": "verbose",
    "terse_form": "implicit",
}


def base_hash(data: dict) -> str:
    cfg = parse_config(data)
    return stage_hash(cfg, cfg.stage("base"), StageInputs())[:16]


def without_added_knobs() -> dict:
    """The tiny config as a config written before the added task knobs: none of them present."""
    data = yaml.safe_load(DIGITSUM.read_text())
    for key in ADDED_TASK_FIELDS:
        data["task"].pop(key, None)
    return data


@pytest.mark.parametrize(("path", "pinned"), [(TINY, TINY_BASE_HASH), (DIGITSUM, DIGITSUM_BASE_HASH)])
def test_the_shipped_bases_keep_their_identity(path, pinned):
    cfg = load_config(path)
    assert stage_hash(cfg, cfg.stage("base"), StageInputs())[:16] == pinned


def test_the_added_knobs_are_the_ones_pinned_here():
    assert set(ADDED_TASK_FIELDS) == set(KNOB_VALUES)


@pytest.mark.parametrize("knob", sorted(ADDED_TASK_FIELDS))
def test_an_added_knob_enters_the_identity_only_once_set(knob):
    before = base_hash(without_added_knobs())
    written_out = without_added_knobs()
    written_out["task"][knob] = ADDED_TASK_FIELDS[knob]  # the default that reproduces the earlier behaviour
    assert base_hash(written_out) == before
    changed = without_added_knobs()
    changed["task"][knob] = KNOB_VALUES[knob]
    if knob == "slip_from":  # only read with slips on: set both, against slips on from step 1
        changed["task"]["slip_rate"] = 0.1
        reference = without_added_knobs()
        reference["task"]["slip_rate"] = 0.1
        assert base_hash(changed) != base_hash(reference)
    else:
        assert base_hash(changed) != before


def test_every_shipped_stage_keeps_its_identity():
    cfg = load_config(TINY)
    assert {st.name: stage_hash(cfg, st, StageInputs())[:16] for st in cfg.stages} == TINY_STAGE_HASHES


@pytest.mark.parametrize(
    ("stage", "field", "setting"),
    [
        ("stage1", "rollback", {"on": ["gap/ratio/max > 2"]}),
        ("stage1", "forced_opening", {"fraction": 0.25}),
        ("distill", "select", "random"),
    ],
)
def test_an_added_stage_field_enters_the_identity_only_once_set(stage, field, setting):
    cfg = load_config(TINY)
    default = cfg.stage(stage).model_dump(mode="json")[field]
    assert default == UNSAID[f"stage/{cfg.stage(stage).kind}"][field]
    written_out = load_config(TINY, [f"stages.{stage}.{field}={default if default is not None else 'null'}"])
    st = written_out.stage(stage)
    assert stage_hash(written_out, st, StageInputs()) == stage_hash(cfg, cfg.stage(stage), StageInputs())
    changed = cfg.model_copy(deep=True)
    changed_stage = type(st).model_validate({**st.model_dump(), field: setting})
    assert stage_hash(changed, changed_stage, StageInputs()) != stage_hash(
        cfg, cfg.stage(stage), StageInputs()
    )


def test_an_opening_said_as_before_keeps_its_identity():
    cfg = load_config(TINY)
    st = cfg.stage("stage1")
    opened = type(st).model_validate({**st.model_dump(), "forced_opening": {"fraction": 0.25}})
    said_out = type(st).model_validate(
        {**st.model_dump(), "forced_opening": {"fraction": 0.25, "answer": "policy", "tiers": None}}
    )
    guessed = type(st).model_validate(
        {**st.model_dump(), "forced_opening": {"fraction": 0.25, "answer": "guess"}}
    )
    assert stage_hash(cfg, said_out, StageInputs()) == stage_hash(cfg, opened, StageInputs())
    assert stage_hash(cfg, guessed, StageInputs()) != stage_hash(cfg, opened, StageInputs())
