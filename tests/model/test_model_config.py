"""Model config: reference field names and rules, refusals that name the field and the reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ringzero.model.config import ModelConfig


def test_rope_dim_is_derived_not_rewritten():
    cfg = ModelConfig(head_dim=32, partial_rotary_factor=0.25, qk_rope_head_dim=8)
    assert cfg.linear_rope_dim == 8 and cfg.partial_rotary_factor == 0.25


@pytest.mark.parametrize("head_dim,fraction", [(30, 0.5), (32, 0.3), (6, 0.5)])
def test_odd_or_fractional_rotary_dims_are_refused(head_dim, fraction):
    with pytest.raises(ValidationError, match="partial_rotary_factor \\* head_dim"):
        ModelConfig(head_dim=head_dim, partial_rotary_factor=fraction, group_norm_size=1)


def test_mla_rope_dim_must_match_the_linear_rotary_width():
    # The reference sizes the MLA rotary table from head_dim * partial_rotary_factor.
    with pytest.raises(
        ValidationError, match=r"qk_rope_head_dim \(8\) must equal head_dim \* partial_rotary_factor"
    ):
        ModelConfig(head_dim=32, partial_rotary_factor=0.5, qk_rope_head_dim=8)
    ModelConfig(
        layout="lightning", head_dim=32, partial_rotary_factor=0.5, qk_rope_head_dim=8
    )  # no MLA layer


def test_tail_rule_makes_layers_past_the_last_group_mla():
    types = ModelConfig(num_hidden_layers=10, layer_group_size=4).layer_types()
    assert [i for i, t in enumerate(types) if t == "mla"] == [3, 7, 8, 9]


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"use_bias": True}, "use_bias / use_qkv_bias must be false"),
        ({"rope_scaling": {"type": "yarn", "factor": 4}}, "rope_scaling must be null"),
        ({"num_experts": 1}, "num_experts must be null for a dense model"),
        (
            {"num_experts": 4, "moe_router_enable_expert_bias": False},
            "moe_router_enable_expert_bias must be true",
        ),
        ({"num_experts": 6, "n_group": 4}, r"n_group \(4\) must divide num_experts \(6\)"),
        ({"num_experts": 8, "n_group": 4, "topk_group": 5}, r"topk_group \(5\) must be at most n_group"),
        ({"num_experts": 8, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 3}, "exceeds the experts"),
        ({"group_norm_size": 3}, r"group_norm_size \(3\) must divide"),
    ],
)
def test_unsupported_or_inconsistent_values_are_refused_with_the_field(fields, needle):
    with pytest.raises(ValidationError, match=needle):
        ModelConfig(**fields)


def test_config_module_imports_first_without_torch():
    import subprocess
    import sys

    code = "import sys, ringzero.model.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layer_types_for_each_layout():
    assert ModelConfig(num_hidden_layers=3, layout="LML").layer_types() == ["lightning", "mla", "lightning"]
    assert ModelConfig(num_hidden_layers=2, layout="mla").layer_types() == ["mla", "mla"]
