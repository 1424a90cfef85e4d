"""Stage identities stay put when the config schema grows: a knob added later enters the hash only when
it is set, so the tiny config's committed base (pretrained once, reused by every later run) keeps its
hash; setting the knob gives a new identity."""

from pathlib import Path

from ringzero.config import load_config
from ringzero.pipeline.identity import ADDED_TASK_FIELDS, stage_hash
from ringzero.stages.base import StageInputs

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"
PRE_DIAL_HASH = "9a664153b334968c"  # the 8-digit base of every store made before the depth-dial knobs existed
TINY_BASE_HASH = "fcfb778546943dcb"  # the tiny config's base since it mixes 2 to 8 digits
PRE_DIAL = "task.min_digits=null"


def base_hash(*overrides: str) -> str:
    cfg = load_config(TINY, list(overrides))
    return stage_hash(cfg, cfg.stage("base"), StageInputs())[:16]


def test_the_tiny_base_keeps_its_identity():
    assert base_hash() == TINY_BASE_HASH
    assert base_hash(PRE_DIAL) == PRE_DIAL_HASH  # without the dial: the base earlier stores committed


def test_each_added_knob_changes_the_identity_once_set():
    assert set(ADDED_TASK_FIELDS) == {"min_digits", "short_fraction"}
    assert base_hash(PRE_DIAL, "task.min_digits=4") != PRE_DIAL_HASH
    assert base_hash(PRE_DIAL, "task.short_fraction=0.2") != PRE_DIAL_HASH
    assert base_hash(PRE_DIAL, "task.short_fraction=0.0") == PRE_DIAL_HASH  # the default, written out
