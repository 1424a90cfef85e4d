"""Values that break the schema or contradict each other are refused, and the message names the field."""

from __future__ import annotations

import json
import re

import pytest
from cluster_kit import CHART, RELEASE, helm

REFUSED = [
    # (--set, fragments the error must contain)
    ("s3.accessKey=AKIAEXAMPLE", ["/s3", "accessKey", "not allowed"]),
    ("minio.rootPassword=hunter22", ["/minio", "rootPassword", "not allowed"]),
    ("cluster.gpusPerNode=-1", ["/cluster/gpusPerNode", "minimum"]),
    ("runAsUser=0", ["/runAsUser", "minimum"]),
    ("cluster.backend=mpijob", ["/cluster/backend", "trainjob"]),
    ("s3.endpoint=http://minio:9000", ["/s3/endpoint", "pattern"]),
    ("cluster.nodeResources.memory=lots", ["/cluster/nodeResources/memory", "pattern"]),
    ("images.trainer.tag=latest", ["images.trainer.tag", "'latest' is not a pinned tag"]),
    ("minio.clientImage.tag=latest", ["minio.clientImage.tag", "not a pinned tag"]),
    ("s3.endpoint=s3.example.com:443", ["s3.endpoint is set and minio.enabled is true"]),
    ("minio.enabled=false", ["s3.endpoint is empty and minio.enabled is false"]),
    ("cluster.device=cpu", ["cluster.gpusPerNode must be 0 when cluster.device is cpu"]),
    ("cluster.gpusPerNode=0", ["cluster.gpusPerNode must be at least 1 when cluster.device is gpu"]),
    ("pipeline.runConfig=missing.yaml", ['pipeline.runConfig "missing.yaml"', "cluster-h200.yaml"]),
    ("serviceAccount.create=false", ["serviceAccount.name"]),
]


@pytest.mark.parametrize("setting,fragments", REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_values_are_refused_with_the_field(helm_bin, setting, fragments):
    done = helm(helm_bin, "template", RELEASE, str(CHART), "--set", setting)
    assert done.returncode != 0, f"{setting} was accepted"
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


def test_schema_is_closed_everywhere():
    """Every object in values.schema.json either lists its properties and forbids others, or is a map."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = []

    def walk(node, path):
        if node.get("type") == "object" and path != "/global":
            if "properties" in node and node.get("additionalProperties") is not False:
                open_objects.append(path)
            if "properties" not in node and "additionalProperties" not in node:
                open_objects.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}/{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "")
    assert not open_objects, open_objects


def test_every_value_is_documented():
    """values.yaml comments each leaf or its section, and the schema describes every property."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    undocumented = []

    def walk(node, path):
        for key, child in (node.get("properties") or {}).items():
            if not child.get("description") and child.get("type") != "object":
                undocumented.append(f"{path}.{key}")
            walk(child, f"{path}.{key}")

    walk(schema, "")
    assert not undocumented, undocumented
    lines = (CHART / "values.yaml").read_text().splitlines()
    bare = [
        line
        for i, line in enumerate(lines)
        if re.match(r"^\s*[A-Za-z][A-Za-z0-9]*:", line)
        and "#" not in line
        and not (i and lines[i - 1].strip().startswith("#"))
    ]
    assert not bare, f"values.yaml keys without a comment on or above them: {bare}"
