"""Static checks of the images and the skaffold file (no Docker engine or skaffold binary needed)."""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from cluster_helm_cli import REPO
from cluster_kit import CHART, SCHEMAS

DOCKERFILES = sorted((REPO / "images").glob("*/Dockerfile"))
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|PRIVATE|CREDENTIAL|API_KEY)", re.IGNORECASE)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def arg_defaults(instrs) -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instrs if word == "ARG" and "=" in rest)


def base_images(instrs) -> list[str]:
    """Resolved external base images of every FROM (stage names excluded)."""
    args, stages, found = arg_defaults(instrs), set(), []
    for word, rest in instrs:
        if word != "FROM":
            continue
        parts = rest.split()
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
        if image not in stages:
            found.append(image)
        if len(parts) == 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
    return found


def pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matches a path or any of its parents."""
    excluded = False
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        if any(
            fnmatch.fnmatch(c, pattern) or fnmatch.fnmatch(c, pattern.replace("**/", "")) for c in candidates
        ):
            excluded = not negate
    return excluded


def test_the_three_images_exist():
    assert [p.parent.name for p in DOCKERFILES] == ["cpu", "rollout", "trainer"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(dockerfile):
    images = base_images(instructions(dockerfile))
    assert images
    assert all(pinned(i) for i in images), images


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_final_user_is_not_root(dockerfile):
    instrs = instructions(dockerfile)
    last_from = max(i for i, (w, _) in enumerate(instrs) if w == "FROM")
    users = [rest for w, rest in instrs[last_from:] if w == "USER"]
    assert users, "the final stage never sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        f"USER {users[-1]}: give a numeric non-root uid so runAsNonRoot can check it"
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert int(uid) == values["runAsUser"], "the chart's runAsUser must match the images' user"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_no_secrets_in_build_args_or_env(dockerfile):
    for word, rest in instructions(dockerfile):
        if word in ("ARG", "ENV"):
            names = re.findall(r"(\w+)=", rest) or [rest.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], f"{word} {rest}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_copied_paths_exist_and_are_in_the_build_context(dockerfile):
    copies = [rest for w, rest in instructions(dockerfile) if w in ("COPY", "ADD") and "--from" not in rest]
    assert copies
    for rest in copies:
        *sources, _dest = rest.split()
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
            assert not dockerignore_excludes(src), f"COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_the_context_small():
    for path in (".venv", ".git", ".cache/helm/helm", "runs/store", "tests/cluster", ".env", "helm/ringzero"):
        assert dockerignore_excludes(path), path
    for path in ("pyproject.toml", "ringzero/cluster/launch.py"):
        assert not dockerignore_excludes(path), path
    assert dockerignore_excludes("ringzero/__pycache__/x.pyc")


def skaffold() -> dict:
    return yaml.safe_load((REPO / "skaffold.yaml").read_text())


@pytest.fixture(scope="module")
def skaffold_schema():
    return jsonschema.Draft7Validator(json.loads((SCHEMAS / "skaffold-v4beta14.json").read_text()))


def apply_patch(doc: dict, patches: list[dict]) -> dict:
    """The JSON-patch subset skaffold profiles use here (add/replace by path)."""
    doc = copy.deepcopy(doc)
    for p in patches:
        *parents, last = [int(k) if k.isdigit() else k for k in p["path"].strip("/").split("/")]
        node = doc
        for key in parents:
            node = node[key]
        node[last] = p["value"]
    return doc


def test_skaffold_validates(skaffold_schema):
    doc = skaffold()
    assert doc["apiVersion"] == "skaffold/v4beta14"
    errors = list(skaffold_schema.iter_errors(doc))
    assert not errors, [e.message[:200] for e in errors]


def test_skaffold_schema_catches_a_typo(skaffold_schema):
    doc = skaffold()
    doc["build"]["artifacts"][0]["docker"]["dockerfiel"] = "images/trainer/Dockerfile"
    assert list(skaffold_schema.iter_errors(doc))


def test_skaffold_builds_the_images_the_chart_runs():
    doc = skaffold()
    artifacts = {a["image"]: a for a in doc["build"]["artifacts"]}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for kind in ("trainer", "rollout", "cpu"):
        artifact = artifacts[values["images"][kind]["repository"]]
        assert (REPO / artifact["context"] / artifact["docker"]["dockerfile"]).is_file()
    (release,) = doc["deploy"]["helm"]["releases"]
    assert (REPO / release["chartPath"] / "Chart.yaml").is_file()
    for key in release["setValueTemplates"]:
        node = values
        for part in key.split("."):
            assert part in node, f"setValueTemplates {key}: no such chart value"
            node = node[part]


@pytest.mark.parametrize("profile,values_file", [("cpu", "values-cpu.yaml"), ("gpu", "values-gpu.yaml")])
def test_profiles_validate_and_use_their_values(skaffold_schema, profile, values_file):
    doc = skaffold()
    prof = next(p for p in doc["profiles"] if p["name"] == profile)
    merged = apply_patch(doc, prof.get("patches", []))
    for section in ("build", "deploy"):
        if section in prof:
            merged[section] = prof[section]
    merged.pop("profiles")
    assert not list(skaffold_schema.iter_errors(merged))
    (release,) = merged["deploy"]["helm"]["releases"]
    assert release["valuesFiles"] == [f"helm/ringzero/{values_file}"]
    assert (REPO / release["valuesFiles"][0]).is_file()
    built = {a["image"] for a in merged["build"]["artifacts"]}
    assert "ringzero/cpu" in built  # the upload Job and install check always need it
    assert ("ringzero/trainer" in built) == (profile == "gpu")
