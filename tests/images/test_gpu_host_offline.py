"""The GPU check runs first time on an offline host that has its own torch and a scientific stack but not
ringzero's other packages: ``bench/gpu/wheels.sh`` fetches exactly the missing wheels (here for this
machine's Python), and ``bench/gpu/run.sh --wheels DIR`` installs them without network into a folder of its
own and runs every phase. The host is an interpreter started with ``-S`` that sees only torch and the
packages ``bench/gpu/host-packages.txt`` names (linked from this environment), like the lent GPU host."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from image_imports import image_site
from images_lock import ROOT, canonical

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gpu-offline")]


def host_packages() -> set[str]:
    lines = (ROOT / "bench" / "gpu" / "host-packages.txt").read_text().splitlines()
    return {canonical(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """``(python, wheels)``: the host's interpreter and the folder wheels.sh filled."""
    root = tmp_path_factory.mktemp("gpu-host")
    site = image_site(host_packages(), root)
    python = root / "python"
    python.write_text(
        f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\nexec {sys.executable} -S "$@"\n'
    )
    python.chmod(0o755)
    wheels = root / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    got = subprocess.run(
        ["bash", "bench/gpu/wheels.sh", str(wheels), "--python-version", version],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    return python, wheels


def run_check(python, out, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(python), OUT=str(out), OMP_NUM_THREADS="1")
    return subprocess.run(
        ["bash", "bench/gpu/run.sh", "--smoke", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_wheels_are_exactly_the_pinned_list_and_match_the_trainer_lock(host):
    _, wheels = host
    listed = {}
    for line in (ROOT / "bench" / "gpu" / "wheels.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            listed[canonical(name)] = version
    got = {canonical(w.name.split("-")[0]): w.name.split("-")[1] for w in wheels.glob("*.whl")}
    assert got == listed
    from images_lock import pins

    trainer = pins("trainer")
    assert all(trainer[name] == version for name, version in listed.items())
    assert not set(listed) & host_packages()


def test_without_the_wheels_the_check_stops_before_any_work_naming_what_is_missing(host, tmp_path):
    python, _ = host
    ran = run_check(python, tmp_path / "out")
    assert ran.returncode == 3, ran.stdout + ran.stderr
    missing = re.search(r"missing Python packages .*: (.*)", ran.stdout).group(1)
    assert {"pydantic", "structlog", "minio", "fastapi", "uvicorn"} <= set(missing.split(", "))
    assert "== stage steps" not in ran.stdout


def test_with_the_wheels_every_phase_runs_offline_within_the_printed_budget(host, tmp_path):
    python, wheels = host
    out = tmp_path / "out"
    ran = run_check(python, out, "--wheels", str(wheels))
    log = ran.stdout + ran.stderr
    assert ran.returncode == 0, log[-4000:]
    budget = int(re.search(r"^time budget: (\d+) s", ran.stdout, re.M).group(1))
    assert budget <= 480
    assert f"installed {len(list(wheels.glob('*.whl')))} wheels" in ran.stdout
    assert "megatron-core is not installed" not in ran.stdout  # the megatron phase ran from the carried wheel
    for name in (
        "stage_steps.json",
        "gap_checks.json",
        "megatron_check.json",
        "decode_graphs.json",
        "gpu.json",
        "gpu.md",
    ):
        assert (out / name).exists(), f"{name} missing; {log[-2000:]}"
    # the host's torch was used, not one from the wheels
    assert not list((out / "site").glob("torch*"))
