"""Model config additions: RoPE share of Lightning heads must give whole rotary pairs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ringzero.model.config import LightningConfig, ModelConfig


def test_rope_dim_is_derived_not_rewritten():
    lc = LightningConfig(head_dim=32, rope_fraction=0.25)
    assert lc.rope_dim == 8 and lc.rope_fraction == 0.25


@pytest.mark.parametrize("head_dim,fraction", [(30, 0.5), (32, 0.3), (6, 0.5)])
def test_odd_or_fractional_rotary_dims_are_refused(head_dim, fraction):
    with pytest.raises(ValidationError, match="rope_fraction \\* head_dim"):
        LightningConfig(head_dim=head_dim, rope_fraction=fraction)


def test_config_module_imports_first_without_torch():
    import subprocess
    import sys

    code = "import sys, ringzero.model.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layer_types_for_each_layout():
    assert ModelConfig(n_layers=3, layout="LML").layer_types() == ["lightning", "mla", "lightning"]
    assert ModelConfig(n_layers=2, layout="mla").layer_types() == ["mla", "mla"]
