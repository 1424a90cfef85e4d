"""Any config module can be the first import of a process (no import cycles through ringzero.config)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "ringzero.config.stages",
        "ringzero.model.config",
        "ringzero.tasks.config",
        "ringzero.store.config",
        "ringzero.parallel.config",
        "ringzero.config.run",
        "ringzero.config.loader",
        "ringzero.config",
        "ringzero.config.cluster",
        "ringzero.config.kfp",
    ],
)
def test_first_import(module):
    out = subprocess.run(
        [sys.executable, "-c", f"import {module}; import sys; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "config modules must not import torch"


# Layers above the config layer; of ringzero.stages only its pure settings module belongs below it.
ABOVE = ("ringzero.cluster", "ringzero.kfp", "ringzero.stages", "ringzero.pipeline")
BELOW_ALLOWED = {"ringzero.stages", "ringzero.config.stages"}


@pytest.mark.parametrize(
    "statement",
    [
        "import ringzero.config",
        "from ringzero.config import RunConfig, config_hash, load_config, parse_config",
        "import ringzero.config.loader, ringzero.config.cluster, ringzero.config.kfp",
    ],
)
def test_the_config_layer_imports_nothing_above_it(statement):
    code = f"{statement}; import sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    import json

    loaded = json.loads(out.stdout)
    above = [m for m in loaded if m.startswith(tuple(f"{p}." for p in ABOVE)) or m in ABOVE]
    assert [m for m in above if m not in BELOW_ALLOWED] == [], f"{statement!r} imports layers above config"


def test_settings_models_live_in_the_config_layer():
    from ringzero.config.cluster import ClusterSettings
    from ringzero.config.kfp import KfpSettings, StagePod
    from ringzero.config.run import RunConfig

    assert RunConfig.model_fields["cluster"].annotation == ClusterSettings | None
    assert RunConfig.model_fields["kfp"].annotation is KfpSettings
    assert KfpSettings.model_fields["stage_pod"].annotation is StagePod
