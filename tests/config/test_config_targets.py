"""Run targets: the expression grammar, errors that name the item, and a config that round-trips with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ringzero.config import RunConfig, parse_config
from ringzero.config.targets import Ref, Term, parse_expr
from ringzero.errors import ConfigError

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def with_targets(targets: list) -> dict:
    data = yaml.safe_load(TINY.read_text())
    data["targets"] = targets
    return data


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    return info.value.problems


@pytest.mark.parametrize(
    ("expr", "left", "op", "right"),
    [
        (
            "eval.eval/accuracy >= 0.90",
            Term(ref=Ref(stage="eval", key="eval/accuracy")),
            ">=",
            Term(offset=0.9),
        ),
        (
            "stage1.len/mean >= 1.5 * stage1.len/mean@step5",
            Term(ref=Ref(stage="stage1", key="len/mean")),
            ">=",
            Term(scale=1.5, ref=Ref(stage="stage1", key="len/mean", step=5)),
        ),
        (
            "eval.compare/distill/accuracy>=eval.compare/stage1/accuracy - 0.03",
            Term(ref=Ref(stage="eval", key="compare/distill/accuracy")),
            ">=",
            Term(ref=Ref(stage="eval", key="compare/stage1/accuracy"), offset=-0.03),
        ),
        (
            "0.7*eval.compare/stage1/len_mean + 2 > eval.eval/pass@k",
            Term(scale=0.7, ref=Ref(stage="eval", key="compare/stage1/len_mean"), offset=2.0),
            ">",
            Term(ref=Ref(stage="eval", key="eval/pass@k")),
        ),
        ("run.wall_minutes < 12", Term(ref=Ref(stage="run", key="wall_minutes")), "<", Term(offset=12.0)),
        (
            "stage1.ratio/p99.9 == -1e-3",
            Term(ref=Ref(stage="stage1", key="ratio/p99.9")),
            "==",
            Term(offset=-0.001),
        ),
    ],
)
def test_expressions_parse_into_scaled_and_offset_terms(expr, left, op, right):
    target = parse_expr(expr)
    assert (target.left, target.op, target.right) == (left, op, right)
    assert target.name == target.expr == expr


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("eval.eval/accuracy <== 0.9", "targets[2]: cannot parse the term '= 0.9'"),
        (
            "eval.eval/accuracy >= 0.9 >= 1",
            "targets[2]: cannot parse 'eval.eval/accuracy >= 0.9 >= 1'; expected TERM OP",
        ),
        ("eval.eval/accuracy", "targets[2]: cannot parse 'eval.eval/accuracy'; expected TERM OP TERM"),
        ("0.5 < 0.9", "targets[2]: '0.5 < 0.9' compares two numbers"),
        ("eval.eval/accuracy * 2 >= 1", "targets[2]: cannot parse the term 'eval.eval/accuracy * 2'"),
        ("stage1.len/mean-0.03 >= 1", "targets[2]: stage1.len/mean-0.03: put a space before the sign"),
        ("run.wall_hours <= 1", "targets[2]: run.wall_hours: the run's values are run.wall_minutes"),
        (
            "nowhere.len/mean >= 1",
            "targets[2]: nowhere.len/mean names no stage of this run (stages: base, stage1",
        ),
        ("1 <= stage9.len/mean@step5", "targets[2]: stage9.len/mean@step5 names no stage of this run"),
        ({"name": "short", "expr": "len/mean <= 3"}, "targets[2].expr: cannot parse the term 'len/mean'"),
        ({"name": "short"}, "targets[2].expr: required, a non-empty string"),
        ({"name": "short", "expr": "eval.eval/accuracy > 0", "gate": True}, "targets[2]: unknown key 'gate'"),
        (0.9, "targets[2]: expected a string like"),
    ],
)
def test_a_bad_target_is_reported_by_its_index(item, expected):
    problems = problems_of(with_targets(["eval.eval/accuracy >= 0.5", "run.wall_minutes <= 12", item]))
    assert any(p.startswith(expected) for p in problems), problems
    assert all(p.startswith("targets[2]") for p in problems), problems


def test_an_unknown_stage_is_reported_with_the_other_field_errors():
    data = with_targets(["stage7.len/mean >= 1"])
    data["model"]["hiden_size"] = 3
    problems = problems_of(data)
    assert any(p.startswith("model.hiden_size: unknown key") for p in problems), problems
    assert [p for p in problems if p.startswith("targets[0]")] == [
        "targets[0]: stage7.len/mean names no stage of this run (stages: base, stage1, distill, stage2, "
        "tier, "
        "eval, or run)"
    ]


def test_targets_default_to_none_and_survive_a_dump_and_a_load():
    data = yaml.safe_load(TINY.read_text())
    data.pop("targets", None)
    assert parse_config(data).targets == []
    cfg = parse_config(
        with_targets(
            ["eval.compare/stage1/accuracy >= 0.90", {"name": "fast run", "expr": "run.wall_minutes <= 12"}]
        )
    )
    assert [t.name for t in cfg.targets] == ["eval.compare/stage1/accuracy >= 0.90", "fast run"]
    # Written back as they were written: a string, or {name, expr} for a named one.
    assert cfg.model_dump(mode="json")["targets"] == [
        "eval.compare/stage1/accuracy >= 0.90",
        {"name": "fast run", "expr": "run.wall_minutes <= 12"},
    ]
    assert RunConfig.model_validate(json.loads(cfg.model_dump_json())) == cfg
    assert RunConfig.model_validate(cfg.model_dump()) == cfg


def test_the_schema_offers_a_string_or_name_and_expr():
    items = RunConfig.model_json_schema()["properties"]["targets"]["items"]
    assert [alt["type"] for alt in items["anyOf"]] == ["string", "object"]
    assert items["anyOf"][1]["required"] == ["name", "expr"]
