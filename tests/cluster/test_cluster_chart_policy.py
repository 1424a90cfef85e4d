"""An independent policy scanner (Checkov) over the chart as rendered for each shipped values file.

Checkov pins versions of its dependencies that conflict with the project's (packaging, boto3), so it lives in
a tool environment of its own: ``RINGZERO_CHECKOV``, else ``checkov`` on PATH, else ``.cache/checkov/``
(``tests/servers/checkov-start.sh`` installs it there; ``make test`` runs it). Without it the scan
is skipped, except under CI (``ci_require.on_ci``: CI=true, 1 or yes), where a missing scanner fails the
suite.

A failed check fails the test unless it is in SKIPS, the one list of accepted findings; each entry is also
listed, with the same justification, in helm/ringzero/README.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_require import require_tool
from cluster_helm_cli import REPO
from cluster_kit import CHART, NAMESPACE, render_text

CHECKOV_VERSION = "3.3.30"
README = CHART / "README.md"
DIGEST = "sha256:" + "0123456789abcdef" * 4
DIGEST_SETS = tuple(
    f"{path}.digest={DIGEST}"
    for path in ("images.trainer", "images.rollout", "images.cpu", "minio.image", "minio.clientImage")
)

# Accepted findings: check id -> why. Both concern images pinned by release tag; with every image pinned by
# digest (images.*.digest, minio.*.digest) the chart passes them, which
# test_digest_pinned_chart_passes_every_check holds to.
SKIPS = {
    "CKV_K8S_43": "Images are pinned by immutable release tags by default; a digest is optional "
    "(images.<name>.digest) because the chart cannot know the digest of images you build.",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent is safe for pinned release tags and digests, and Always "
    "would make every pod start depend on the registry; with a digest set the check passes.",
}


def checkov_binary() -> str | None:
    for candidate in (
        os.environ.get("RINGZERO_CHECKOV"),
        shutil.which("checkov"),
        str(REPO / ".cache" / "checkov" / "bin" / "checkov"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def checkov():
    found = checkov_binary()
    if found is None:
        # `make test` installs it (tests/servers/checkov-start.sh) and says why when it could not
        message = os.environ.get("RINGZERO_CHECKOV_ERROR") or (
            "no Checkov policy scanner: set RINGZERO_CHECKOV, put checkov on PATH, or run "
            "tests/servers/checkov-start.sh (a virtualenv of its own under .cache/checkov)"
        )
        require_tool("checkov", message)  # a skip here, a failure under CI (CI=true, 1 or yes)
    return found


def scan(checkov: str, manifest: str, tmp_path: Path) -> dict:
    """Checkov's Kubernetes report of one rendered manifest: {"passed": [...], "failed": [...]}, check ids."""
    path = tmp_path / "rendered.yaml"
    path.write_text(manifest)
    done = subprocess.run(
        [checkov, "-f", str(path), "--framework", "kubernetes", "-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), f"checkov failed to run:\n{done.stderr[-2000:]}"
    report = json.loads(done.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report.get("check_type", "kubernetes") == "kubernetes"
    results = report.get("results", {})
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return {"passed": results.get("passed_checks", []), "failed": results.get("failed_checks", [])}


def unaccepted(report: dict, skips: dict[str, str]) -> list[str]:
    return sorted(
        f"{f['check_id']} {f['check_name']} ({f['resource']})"
        for f in report["failed"]
        if f["check_id"] not in skips
    )


VALUES_FILES = sorted(p.name for p in CHART.glob("values*.yaml"))


def test_every_shipped_values_file_is_scanned():
    assert "values.yaml" in VALUES_FILES and len(VALUES_FILES) >= 6, VALUES_FILES


@pytest.mark.parametrize("values", VALUES_FILES)
def test_the_rendered_chart_passes_the_policy_scan(helm_bin, checkov, tmp_path, values):
    report = scan(checkov, render_text(helm_bin, [] if values == "values.yaml" else [values]), tmp_path)
    assert len(report["passed"]) > 50, "the scanner checked next to nothing: did it see the workloads?"
    problems = unaccepted(report, SKIPS)
    assert not problems, (
        "fix the chart or add a justified entry to SKIPS and the chart README:\n" + "\n".join(problems)
    )


def test_digest_pinned_chart_passes_every_check(helm_bin, checkov, tmp_path):
    """The skipped checks are about tag-pinned images only: pinned by digest, nothing at all fails."""
    report = scan(checkov, render_text(helm_bin, [], DIGEST_SETS), tmp_path)
    assert not unaccepted(report, {}), unaccepted(report, {})
    assert {f["check_id"] for f in report["passed"]} >= set(SKIPS)


def test_the_scan_flags_a_weak_workload(checkov, tmp_path):
    """Guard against a scan that passes everything: a root, writable, unbounded pod fails many checks."""
    weak = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "weak", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox:latest",
                            "securityContext": {"privileged": True},
                            "env": [
                                {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                            ],
                        }
                    ]
                },
            },
        },
    }
    failed = set(unaccepted(scan(checkov, json.dumps(weak), tmp_path), SKIPS))
    ids = {f.split()[0] for f in failed}
    for expected in ("CKV_K8S_16", "CKV_K8S_22", "CKV_K8S_11", "CKV_K8S_13", "CKV_K8S_35", "CKV_K8S_8"):
        assert expected in ids, f"{expected} not flagged: {sorted(ids)}"


def test_every_skip_is_justified_in_the_chart_readme():
    text = " ".join(README.read_text().split())
    for check, why in SKIPS.items():
        assert f"`{check}`" in text, f"{check} is skipped but not listed in {README.relative_to(REPO)}"
        assert " ".join(why.split()) in text, f"{check}: the README must give the same justification"
