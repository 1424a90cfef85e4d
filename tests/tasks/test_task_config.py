"""ArithmeticTask validation names the field at fault and never rewrites the input."""

import pytest

from ringzero.config.loader import parse_config
from ringzero.errors import ConfigError
from ringzero.tasks.config import ArithmeticTask


def problems_of(task: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config({"run": {"name": "t"}, "task": {"kind": "arithmetic", **task}})
    return str(err.value)


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"operation": "digitsum", "operands": 3}, "operands"),
        ({"operation": "parity", "digits": 27}, "digits"),
        ({"filler_fraction": 0.6, "drill_fraction": 0.4}, "filler_fraction"),
        ({"lookup_fraction": 0.5, "worked_fraction": 0.3, "drill_fraction": 0.2}, "filler_fraction"),
        ({"operation": "add", "lookup_fraction": 0.1}, "lookup_fraction"),
        ({"operation": "mul"}, "task.operation"),
        ({"digits": 1}, "task.digits"),
        ({"trace_fraction": 1.5}, "task.trace_fraction"),
    ],
)
def test_bad_knobs_are_named(task, field):
    assert f"{field}:" in problems_of(task)


def test_add_takes_many_operands_and_long_digits():
    cfg = ArithmeticTask(operation="add", digits=40, operands=5)
    assert (cfg.digits, cfg.operands) == (40, 5)


def test_defaults_are_the_documented_task():
    cfg = ArithmeticTask()
    assert (cfg.operation, cfg.digits, cfg.trace_fraction) == ("digitsum", 12, 0.05)
