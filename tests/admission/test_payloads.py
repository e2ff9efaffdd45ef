"""Real AdmissionReview payloads (tests/admission/payloads/*.json): decisions and patches.

Payloads were written from the admission.k8s.io/v1 API reference and the shape
kube-apiserver sends for ReplicaSet, StatefulSet, DaemonSet and Job pods
(server-side defaults, service account volume, default tolerations). Every
patched pod must validate against the Kubernetes OpenAPI schema.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from spotguard.admission import core
from spotguard.gateway import resources as r
from spotguard.policy.config import Config

from tests.admission import cluster
from tests.admission.fakekube import FakeKube

PAYLOADS = Path(__file__).parent / "payloads"
RS_UID = "6f1c2d3e-0a1b-4c5d-8e9f-000000000001"
STS_UID = "6f1c2d3e-0a1b-4c5d-8e9f-000000000002"
K8S_VERSION = "1.33.0"


def load(name: str) -> dict[str, Any]:
    return json.loads((PAYLOADS / f"{name}.json").read_text())


def fake_cluster() -> FakeKube:
    k = FakeKube()
    cluster.basic_cluster(k)
    k.put(r.NAMESPACES, {"metadata": {"name": "monitoring"}})
    dep = k.put(
        r.DEPLOYMENTS,
        {
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    k.put(
        r.REPLICASETS,
        {
            "metadata": {
                "name": "web-5d8f7c9b4",
                "namespace": "shop",
                "uid": RS_UID,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": "web",
                        "uid": dep["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d8f7c9b4"}}},
        },
    )
    k.put(
        r.STATEFULSETS,
        {
            "metadata": {"name": "db", "namespace": "shop", "uid": STS_UID},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "db"}}},
        },
    )
    return k


def captured_cluster() -> FakeKube:
    """The owners of the payloads captured from the simulated cluster (captured-owners.json)."""
    k = FakeKube()
    cluster.basic_cluster(k)
    for obj in json.loads((PAYLOADS / "captured-owners.json").read_text()):
        k.put(
            r.DEPLOYMENTS
            if obj["kind"] == "Deployment"
            else r.REPLICASETS
            if obj["kind"] == "ReplicaSet"
            else r.STATEFULSETS,
            obj,
        )
    return k


CAPTURED = [
    # captured from the simulated cluster's API server calling a recording webhook
    ("captured-deployment-pod", "on-demand"),
    ("captured-deployment-pod-dry-run", "on-demand"),
    ("captured-statefulset-pod-0", "on-demand"),
    ("captured-statefulset-pod-1", "on-demand"),  # 2 replicas: floor 2 // 2 + 1 = 2
]


@pytest.mark.parametrize(("name", "expected"), CAPTURED)
def test_captured_payload(name: str, expected: str) -> None:
    k = captured_cluster()
    review = load(name)
    answer = core.serve(copy.deepcopy(review), core.Context(Config(), k))
    assert answer["response"]["uid"] == review["request"]["uid"]
    patched = jsonpatch.apply_patch(review["request"]["object"], cluster.patch_of(answer))
    assert patched["metadata"]["labels"]["spotguard.io/placement"] == expected
    validate_pod(patched)
    if review["request"].get("dryRun"):
        assert k.stats.writes == 0


def fill_on_demand_slot(k: FakeKube) -> None:
    pod = load("deployment-pod")["request"]["object"]
    pod["metadata"]["name"] = "web-5d8f7c9b4-aaaaa"
    pod["metadata"]["labels"]["spotguard.io/placement"] = "on-demand"
    pod["spec"]["nodeName"] = "od-0"
    pod["status"] = {"phase": "Running"}
    k.put(r.PODS, pod)


CASES: list[tuple[str, str | None, bool]] = [
    # payload, expected placement (None: no patch), on-demand slot already filled
    ("deployment-pod", "on-demand", False),
    ("deployment-pod", "spot", True),
    ("deployment-pod-user-affinity", "on-demand", False),
    ("deployment-pod-user-affinity", "spot", True),
    ("deployment-pod-tolerations-spread", "spot", True),
    ("deployment-pod-tolerations-spread", "on-demand", False),
    ("deployment-pod-init-containers", "on-demand", False),
    ("deployment-pod-dry-run", "on-demand", False),
    ("deployment-pod-reinvocation", None, False),
    ("statefulset-pod-0", "on-demand", False),
    ("statefulset-pod-2", "spot", False),
    ("pod-nodeselector-capacity", None, False),
    ("daemonset-pod", None, False),
    ("job-pod", None, False),
    ("kube-system-pod", None, False),
    ("mirror-pod", None, False),
    ("bare-pod", None, False),
    ("pod-update", None, False),
]


def validate_pod(pod: dict[str, Any]) -> None:
    pod = copy.deepcopy(pod)
    pod["metadata"].setdefault("name", pod["metadata"].get("generateName", "p-") + "x1y2z")
    pod["metadata"].pop("creationTimestamp", None)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("name", "expected", "filled"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_payload(name: str, expected: str | None, filled: bool) -> None:
    # GIVEN a cluster with the payload's owners, and a real AdmissionReview
    k = fake_cluster()
    if filled:
        fill_on_demand_slot(k)
    review = load(name)
    pod = review["request"]["object"]
    ctx = core.Context(Config(), k)
    # WHEN it is served
    answer = core.serve(copy.deepcopy(review), ctx)
    # THEN the answer echoes the uid, allows, and carries the expected patch
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    assert response["allowed"] is True
    ops = cluster.patch_of(answer)
    if expected is None:
        assert ops == []
        return
    patched = jsonpatch.apply_patch(pod, ops)
    assert patched["metadata"]["labels"]["spotguard.io/placement"] == expected
    validate_pod(patched)
    assert jsonpatch.apply_patch(pod, ops) == patched  # ops do not depend on order of application
    again = core.serve(cluster.review(patched, "shop"), ctx)
    assert cluster.patch_of(again) == []  # reinvocation is a no-op
    if review["request"].get("dryRun"):
        assert k.stats.writes == 0


def test_user_node_affinity_terms_are_kept_and_each_gets_the_on_demand_requirement() -> None:
    review = load("deployment-pod-user-affinity")
    pod = review["request"]["object"]
    patched = jsonpatch.apply_patch(pod, cluster.patch_of(core.serve(review, core.Context(Config(), fake_cluster()))))
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    want = {"key": "node.kubernetes.io/capacity", "operator": "NotIn", "values": ["spot"]}
    original = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 2
    for term, before in zip(terms, original, strict=True):
        assert want in term["matchExpressions"]
        assert all(e in term["matchExpressions"] for e in before["matchExpressions"])
    assert patched["spec"]["affinity"]["podAntiAffinity"] == pod["spec"]["affinity"]["podAntiAffinity"]


def test_user_tolerations_and_spread_are_kept_on_a_spot_pod() -> None:
    k = fake_cluster()
    fill_on_demand_slot(k)
    review = load("deployment-pod-tolerations-spread")
    pod = review["request"]["object"]
    patched = jsonpatch.apply_patch(pod, cluster.patch_of(core.serve(review, core.Context(Config(), k))))
    assert all(t in patched["spec"]["tolerations"] for t in pod["spec"]["tolerations"])
    spread = patched["spec"]["topologySpreadConstraints"]
    assert spread[0] == pod["spec"]["topologySpreadConstraints"][0]  # the user's zone constraint, unchanged
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
