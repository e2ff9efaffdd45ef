"""The surge copy (issue 24): a ReplicaSet of spotguard's that no controller adopts,
whose pods every selector of the Deployment's sees, pinned to on-demand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from spotguard.policy import config, patches, surgecopy
from spotguard.policy.capacity import Capacity
from spotguard.policy.interruption import selector_matches
from spotguard.policy.surgecopy import SURGE_OF, Refusal
from spotguard.policy.workloads import SURGE_REPLICA

CFG = config.Config()
NO_X = {"key": "x", "operator": "DoesNotExist"}


def deployment(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "u-1",
            "labels": {"app.kubernetes.io/instance": "shop-app", "kustomize.toolkit.fluxcd.io/name": "apps"},
            "annotations": {"argocd.argoproj.io/tracking-id": "shop:apps/Deployment:shop/web"},
        },
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web", "tier": "front"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }
    base["spec"].update(spec)
    return base


def built(dep: dict[str, Any], size: int = 2) -> dict[str, Any]:
    out = surgecopy.build(dep, size, CFG, events=("e-1",))
    assert not isinstance(out, Refusal), out
    return out


def test_the_deployment_never_adopts_the_copy() -> None:
    # ClaimReplicaSets adopts an orphan ReplicaSet whose own labels match the selector.
    dep = deployment()
    rs = built(dep)
    assert not selector_matches(dep["spec"]["selector"], rs["metadata"]["labels"])
    assert "ownerReferences" not in rs["metadata"]


def test_the_copy_never_adopts_the_deployments_pods() -> None:
    dep = deployment()
    rs = built(dep)
    assert not selector_matches(rs["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
    # ... and its own pods match its selector (the API refuses a ReplicaSet otherwise)
    assert selector_matches(rs["spec"]["selector"], rs["spec"]["template"]["metadata"]["labels"])


def test_services_budgets_and_the_autoscaler_see_the_copys_pods() -> None:
    dep = deployment()
    rs = built(dep)
    pod_labels = rs["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(dep["spec"]["selector"], pod_labels)
    assert pod_labels == {"app": "web", "tier": "front", SURGE_OF: "web"}
    assert surgecopy.surge_of(pod_labels) == "web"
    assert surgecopy.surge_of(dep["spec"]["template"]["metadata"]["labels"]) is None


def test_the_copy_carries_no_gitops_tracking_and_is_sized_and_marked() -> None:
    rs = built(deployment(minReadySeconds=5), size=3)
    meta = rs["metadata"]
    assert meta["name"] == "spotguard-surge-web" and meta["namespace"] == "shop"
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "spotguard", SURGE_OF: "web"}
    assert meta["annotations"] == {
        surgecopy.SURGE_FOR: "Deployment/web",
        surgecopy.SURGE_FOR_UID: "u-1",
        surgecopy.EVENTS: "e-1",
    }
    assert rs["spec"]["replicas"] == 3 and rs["spec"]["minReadySeconds"] == 5
    assert rs["spec"]["template"]["metadata"]["annotations"] == {"a": "b", SURGE_REPLICA: "true"}


def test_the_copys_pods_require_on_demand() -> None:
    rs = built(deployment())
    terms = rs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": patches.on_demand_terms(CFG)[0]}]


def test_the_on_demand_requirement_is_anded_into_the_users_terms_and_the_deployment_is_untouched() -> None:
    user = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    dep = deployment()
    dep["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {patches.REQUIRED: {"nodeSelectorTerms": [user]}}}
    before = copy.deepcopy(dep)
    rs = built(dep)
    terms = rs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": user["matchExpressions"] + patches.on_demand_terms(CFG)[0]}]
    assert dep == before


def test_unknown_capacity_as_spot_gives_one_term_per_on_demand_scheme() -> None:
    cfg = config.Config(unknown_capacity=Capacity.SPOT)
    out = surgecopy.build(deployment(), 1, cfg)
    assert not isinstance(out, Refusal)
    terms = out["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == patches.on_demand_terms(cfg)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d.update(kind="StatefulSet"), "placement"),
        (lambda d: d["spec"].update(selector={"matchExpressions": [NO_X]}), "adopt"),
        (lambda d: d["spec"]["template"]["metadata"]["labels"].update({SURGE_OF: "web"}), SURGE_OF),
        (lambda d: d["spec"].pop("selector"), "no selector"),
        (lambda d: d["spec"]["template"]["metadata"]["labels"].update(app="other"), "does not match"),
    ],
)
def test_refused_where_the_copy_could_not_stay_apart(change: Any, reason: str) -> None:
    dep = deployment()
    change(dep)
    out = surgecopy.build(dep, 2, CFG)
    assert isinstance(out, Refusal) and reason in out.reason


def test_nothing_to_surge() -> None:
    assert isinstance(surgecopy.build(deployment(), 0, CFG), Refusal)
