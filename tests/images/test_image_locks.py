"""Each image holds what the code it runs imports: its ``requirements.lock`` pins every package it installs
(``name==version``, installed with ``--no-deps``), and the code paths the image runs import cleanly in an
interpreter that sees only the lock and what the base image provides."""

from __future__ import annotations

import re

import pytest
from image_imports import all_modules, closure, distributions, import_in_image, written_third_party
from images_lock import IMAGES, ROOT, base_provided, canonical, lock_path, pins

# Code that runs only in another image, by module prefix, with where it runs instead.
ELSEWHERE = {
    "ringzero.kfp": "pipeline steps and the upload Job (cpu image)",
    "ringzero.cluster.kube": "the launcher in a pipeline step (cpu image)",
    "ringzero.cluster.kfp_upload": "the upload Job (cpu image)",
}


def entries(image: str) -> set[str]:
    """The own modules an image's processes import (and, written inside their functions, may import)."""
    if image == "rollout":  # ringzero runs there only as the fetch-model init container
        return closure(["ringzero.cluster.fetch_model"], {})
    modules = set(all_modules("ringzero"))
    if image == "cpu":
        return modules | set(all_modules("pipelines")) | set(all_modules("components"))
    return {m for m in modules if not any(m == p or m.startswith(p + ".") for p in ELSEWHERE)}


def allowed(image: str) -> set[str]:
    return set(pins(image)) | base_provided(image)


@pytest.mark.parametrize("image", IMAGES)
def test_every_line_is_pinned_and_the_dockerfile_installs_exactly_the_lock(image):
    assert pins(image)
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    assert f"source=images/{image}/requirements.lock" in dockerfile
    installs = [
        line for line in dockerfile.splitlines() if "pip install" in line and "requirements.lock" in line
    ]
    assert installs and all("--no-deps" in line for line in installs), installs
    # nothing else is resolved at build time: every other pip install names a pinned torch or nothing
    for line in dockerfile.splitlines():
        if "pip install" in line and "requirements.lock" not in line:
            assert re.search(r'"torch==\$\{TORCH_VERSION\}"', line), line
    assert ".dockerignore" and "!images/*/requirements.lock" in (ROOT / ".dockerignore").read_text()


@pytest.mark.parametrize("image", IMAGES)
def test_ringzero_s_declared_dependencies_are_in_every_image(image):
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {canonical(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    assert names <= allowed(image), f"{image}: {sorted(names - allowed(image))} not in its lock or base"


def test_the_trainer_holds_the_megatron_core_its_dockerfile_names_and_einops():
    """einops: megatron-core imports it inside ``try`` without declaring it, and calls it for hierarchical
    context-parallel groups and MLA's inference path, so an image without it fails there at run time."""
    version = re.search(
        r"^ARG MEGATRON_CORE_VERSION=(\S+)", (ROOT / "images/trainer/Dockerfile").read_text(), re.M
    )
    assert pins("trainer")["megatron-core"] == version.group(1)
    assert "einops" in pins("trainer")


@pytest.mark.parametrize("image", IMAGES)
def test_the_lock_is_closed_under_its_packages_requirements(image):
    """With --no-deps nothing fills a gap: every requirement of a locked package (for this platform) is
    locked or provided by the base."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    missing = []
    for name in pins(image):
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # not installed here; the import check below covers what is
        for req in map(Requirement, requires):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                if canonical(req.name) not in allowed(image):
                    missing.append(f"{name} -> {req}")
    assert not missing, f"{lock_path(image)}: {missing}"


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_s_code_imports_with_only_its_lock_and_base(image, tmp_path):
    ran = import_in_image(entries(image), allowed(image), tmp_path)
    assert ran.returncode == 0, f"{image}: {ran.stderr[-2000:]}"
    written = distributions(written_third_party(entries(image)))
    outside = {d: tops for d, tops in written.items() if d not in allowed(image)}
    assert not outside, f"{image}: imports written in its code name packages outside its lock: {outside}"


def test_negative_controls_a_trainer_without_requests_or_tokenizers_is_caught(tmp_path):
    """Both were missing from ringzero's declared dependencies until this check: the rollout client talks
    HTTP with requests at import, and every checkpoint writes a tokenizer.json with tokenizers (lazily)."""
    ran = import_in_image(
        {"ringzero.rollout.clients.http_client"}, allowed("trainer") - {"requests"}, tmp_path
    )
    assert ran.returncode != 0 and "No module named 'requests'" in ran.stderr
    written = distributions(written_third_party(entries("trainer")))
    assert "tokenizers" in written and "tokenizers" in allowed("trainer")


def test_negative_control_a_rollout_image_without_minio_cannot_fetch(tmp_path):
    ran = import_in_image(entries("rollout"), allowed("rollout") - {"minio"}, tmp_path)
    assert ran.returncode != 0 and "No module named 'minio'" in ran.stderr
    assert "kfp" not in written_third_party(entries("rollout"))


@pytest.mark.parametrize("image", IMAGES)
def test_each_lock_was_written_from_today_s_requirements(image):
    """The header lists the ranges the lock was resolved from; a dependency added to pyproject.toml or a
    megatron-core bump in the Dockerfile without rerunning images/common/lock.py fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_lock_tool", ROOT / "images" / "common" / "lock.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    header = [line[4:] for line in lock_path(image).read_text().splitlines() if line.startswith("#   ")]
    assert header == tool.requirements(image)
    assert base_provided(image) == {canonical(n) for n in tool.BASE[image]}


def test_the_fetch_model_container_finds_ringzero_where_the_rollout_image_puts_it():
    from ringzero.cluster.rollout import RINGZERO_SITE

    dockerfile = (ROOT / "images" / "rollout" / "Dockerfile").read_text()
    assert f"--target {RINGZERO_SITE} " in dockerfile
    assert not re.search(r"^ENV .*PYTHONPATH", dockerfile, re.M)  # SGLang's processes never see ringzero's
    from ringzero.cluster.job import StageJob
    from ringzero.cluster.rollout import RolloutSpec, render_rollout
    from ringzero.config.cluster import ClusterSettings
    from ringzero.store.config import S3Settings

    settings = ClusterSettings.model_validate(
        {
            "namespace": "ml",
            "images": {k: {"repository": k, "tag": "1"} for k in ("trainer", "rollout", "cpu")},
            "s3_secret": {"name": "s3"},
        }
    )
    job = StageJob(run="r", stage="s", name="r-s-1", namespace="ml", config_yaml="", dp=1, cp=1)
    (deployment,) = [
        o
        for o in render_rollout(settings, job, RolloutSpec("s3://b/c", S3Settings(), True, False, 0))
        if o["kind"] == "Deployment"
    ]
    pod = deployment["spec"]["template"]["spec"]
    env = {
        c["name"]: {e["name"]: e.get("value") for e in c["env"]}
        for c in [*pod["containers"], *pod["initContainers"]]
    }
    assert env["fetch-model"]["PYTHONPATH"] == RINGZERO_SITE and "PYTHONPATH" not in env["sglang"]
