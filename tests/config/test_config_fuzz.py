"""Random garbage never escapes as anything but a ConfigError with at least one named problem."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringzero.config import parse_config
from ringzero.config.loader import apply_overrides, read_yaml
from ringzero.errors import ConfigError

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=12)
)
keys = st.sampled_from(
    [
        "run",
        "model",
        "stages",
        "name",
        "kind",
        "steps",
        "rl",
        "lr",
        "x",
        "task",
        "mla",
        "precision",
        "train",
        "storage",
        "root",
        "gate",
        "loss",
        "tiers",
    ]
)
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(keys, kids, max_size=5)),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, trees, max_size=6))
def test_random_trees_give_named_problems(data):
    try:
        parse_config(data, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_yaml_text_is_refused_cleanly(text):
    try:
        data = read_yaml(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems
        return
    try:
        parse_config(data, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_random_overrides_are_refused_cleanly(overrides):
    data = yaml.safe_load("run: {name: x}\nstages: [{name: a, kind: pretrain}]\n")
    try:
        apply_overrides(data, overrides)
        parse_config(data)
    except ConfigError as exc:
        assert exc.problems
