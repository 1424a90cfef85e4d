"""Security properties of every rendered combination: restricted pods, namespaced least-privilege RBAC,
no credential values, network isolation."""

from __future__ import annotations

import copy

import pytest
from cluster_kit import COMBINATIONS, plain_secret_env, pod_specs, restricted_violations, validate


def test_the_pod_checker_flags_a_weak_pod():
    """Guard against a checker that passes everything."""
    weak = {
        "securityContext": {"runAsUser": 0},
        "hostNetwork": True,
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}],
    }
    problems = "\n".join(restricted_violations("weak", weak))
    for expected in (
        "runAsUser 0",
        "hostNetwork",
        "allowPrivilegeEscalation",
        "capabilities not dropped",
        "root filesystem writable",
        "seccomp",
        "no writable /tmp",
    ):
        assert expected in problems


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_every_pod_is_restricted(rendered, name):
    pods = [p for obj in rendered[name] for p in pod_specs(obj)]
    assert len(pods) >= 2
    problems = [v for where, pod in pods for v in restricted_violations(where, pod)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_rbac_is_namespaced_and_explicit(rendered, name):
    objs = rendered[name]
    kinds = {o["kind"] for o in objs}
    assert "ClusterTrainingRuntime" not in kinds
    # the one cluster-scoped grant is rbac.readCluster's read-only role (off in a profile namespace)
    cluster_roles = [o for o in objs if o["kind"] == "ClusterRole"]
    assert len(cluster_roles) == (0 if name == "multiuser" else 1)
    for role in cluster_roles:
        assert {v for rule in role["rules"] for v in rule["verbs"]} <= {"get", "list"}
    (role,) = [o for o in objs if o["kind"] == "Role"]
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "update", "patch"}, rule
    (binding,) = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["kind"] == "Role"


def test_rbac_grants_exactly_what_the_launcher_uses(rendered):
    grants = {
        (g, r): set(rule["verbs"])
        for rule in next(o for o in rendered["defaults"] if o["kind"] == "Role")["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    lifecycle = {"create", "get", "list", "watch", "delete"}
    assert grants[("trainer.kubeflow.org", "trainjobs")] == lifecycle
    assert grants[("apps", "deployments")] == lifecycle
    assert grants[("", "services")] == lifecycle
    assert grants[("", "configmaps")] == lifecycle
    assert grants[("", "pods/log")] == {"get"}
    assert "create" not in grants[("", "pods")]
    assert ("kubeflow.org", "pytorchjobs") not in grants
    fallback = {
        r
        for rule in next(o for o in rendered["pytorchjob"] if o["kind"] == "Role")["rules"]
        for r in rule["resources"]
    }
    assert "pytorchjobs" in fallback and "trainjobs" not in fallback


@pytest.mark.parametrize("name", sorted(COMBINATIONS))
def test_no_credential_values_rendered(rendered, name):
    objs = rendered[name]
    assert not [o for o in objs if o["kind"] == "Secret"], "the chart must not create Secrets"
    bad = [(o["kind"], o["metadata"]["name"], n) for o in objs for n in plain_secret_env(o)]
    assert not bad, bad
    refs = [
        e
        for o in objs
        for where, pod in pod_specs(o)
        for c in pod.get("containers", [])
        for e in c.get("env", [])
        if "secretKeyRef" in str(e)
    ]
    assert not refs, "Secrets reach pods as mounted files, never as environment variables"


@pytest.mark.parametrize("name", ["defaults", "external-s3"])
def test_network_policies_cover_every_chart_pod(rendered, name):
    objs = rendered[name]
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policies and all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies)

    def selected(labels, policy):
        sel = policy["spec"]["podSelector"]
        ok = all(labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items())
        return ok and all(labels.get(e["key"]) in e["values"] for e in sel.get("matchExpressions") or [])

    for obj in objs:
        if obj["kind"] in ("Deployment", "Job"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert any(selected(labels, p) for p in policies), f"{obj['metadata']['name']} has no policy"
    rollout = next(p for p in policies if p["metadata"]["name"].endswith("-rollout"))
    assert rollout["spec"]["ingress"][0]["ports"] == [{"port": 30000, "protocol": "TCP"}]
    assert (
        rollout["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        == "trainer"
    )


def test_network_policies_can_be_turned_off(helm_bin):
    from cluster_kit import render

    objs = render(helm_bin, [], ("networkPolicy.enabled=false",))
    assert not [o for o in objs if o["kind"] == "NetworkPolicy"]


def test_validators_reject_typos(rendered):
    """The schemas are closed: a misspelt field fails instead of being silently dropped by the server."""
    objs = rendered["defaults"]
    trainjob = copy.deepcopy(next(o for o in objs if o["kind"] == "TrainJob"))
    trainjob["spec"]["trainer"]["numnodes"] = 2
    with pytest.raises(AssertionError, match="numnodes"):
        validate(trainjob)
    deployment = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(AssertionError):
        validate(deployment)


def test_reading_nodes_and_the_job_crds_is_the_one_cluster_grant_and_can_be_turned_off(helm_bin):
    from cluster_kit import render

    objs = render(helm_bin, [], ())
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": ["trainjobs.trainer.kubeflow.org", "pytorchjobs.kubeflow.org"],
            "verbs": ["get"],
        },
    ]
    # the CRD names granted are the ones the launcher's version check reads
    from ringzero.cluster.versions import CRDS

    assert set(role["rules"][1]["resourceNames"]) == {c.name for c in CRDS.values()}
    (binding,) = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    (account,) = [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == "rz-ringzero"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ml"}
    ]
    # two releases in two namespaces get two cluster-scoped names
    assert role["metadata"]["name"] == "ml-rz-ringzero-read-cluster"
    off = render(helm_bin, [], ("rbac.readCluster=false",))
    assert not {o["kind"] for o in off} & {"ClusterRole", "ClusterRoleBinding"}


def test_ipc_lock_reaches_the_smoke_job_s_nccl_container_only_when_asked(helm_bin):
    from cluster_kit import pod_specs, render

    def added(values):
        objs = render(helm_bin, ["values-gpu.yaml"], values)
        out = {}
        for obj in objs:
            for _, pod in pod_specs(obj):
                for c in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                    caps = (c.get("securityContext") or {}).get("capabilities") or {}
                    out[(obj["kind"], c["name"])] = caps.get("add", [])
        return out

    default, locked = added(()), added(("cluster.ipcLock=true",))
    assert not any(default.values())
    assert {k for k, v in locked.items() if v} == {("TrainJob", "node")}
    assert locked[("TrainJob", "node")] == ["IPC_LOCK"]
