"""The checked-in compiled pipeline of configs/tiny-cpu.yaml matches what the code compiles today."""

import difflib
from pathlib import Path

import pytest
import yaml
from kfp_kit import compile_docs

pytestmark = pytest.mark.xdist_group("kfp")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tiny-cpu.yaml"
GOLDEN = REPO / "pipelines" / "compiled" / "tiny-cpu.yaml"
REGENERATE = "ringzero kfp compile configs/tiny-cpu.yaml --output pipelines/compiled/tiny-cpu.yaml"


def test_compiled_tiny_pipeline_matches_the_checked_in_file(tmp_path):
    out = tmp_path / "tiny-cpu.yaml"
    compile_docs(CONFIG, out)
    # Compared as parsed documents (the spec has no volatile fields: no timestamps, the SDK version is pinned).
    if list(yaml.safe_load_all(out.read_text())) != list(yaml.safe_load_all(GOLDEN.read_text())):
        diff = "".join(difflib.unified_diff(
            GOLDEN.read_text().splitlines(keepends=True), out.read_text().splitlines(keepends=True),
            "checked in", "compiled now", n=2,
        ))
        pytest.fail(f"{GOLDEN.relative_to(REPO)} is stale; if the change is intended, regenerate it with\n"
                    f"  {REGENERATE}\n{diff[:6000]}")
