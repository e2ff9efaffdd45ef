"""Can a Karpenter NodePool launch an on-demand node for a pod? (policy.nodepools)

Each case is Karpenter's own rule (kubernetes-sigs/karpenter pkg/scheduling/requirements.go
Compatible with AllowUndefinedWellKnownLabels, requirement.go, nodeclaimtemplate.go,
provisioner.go; see the module's docstring), with spotguard's on-demand requirement added.
"""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.policy import config, nodepools, patches
from spotguard.policy.views import PodView

ON_DEMAND = patches.on_demand_terms(config.Config())


def pool(requirements: list[dict[str, Any]] | None = None, **extra: Any) -> nodepools.NodePool:
    spec: dict[str, Any] = {"template": {"spec": {"requirements": requirements or []}}}
    if "labels" in extra:
        spec["template"]["metadata"] = {"labels": extra["labels"]}
    if "taints" in extra:
        spec["template"]["spec"]["taints"] = extra["taints"]
    if "limits" in extra:
        spec["limits"] = extra["limits"]
    raw: dict[str, Any] = {"metadata": {"name": extra.get("name", "default")}, "spec": spec}
    if "status" in extra:
        raw["status"] = extra["status"]
    return nodepools.NodePool.from_json(raw)


def capacity(*values: str, operator: str = "In") -> dict[str, Any]:
    return {"key": "karpenter.sh/capacity-type", "operator": operator, "values": list(values)}


def pod(**spec: Any) -> PodView:
    return PodView.from_json({"metadata": {"name": "p", "namespace": "shop"}, "spec": spec})


def launches(p: PodView, *pools: nodepools.NodePool) -> str | None:
    return nodepools.on_demand_for(p, pools, ON_DEMAND)


@pytest.mark.parametrize(
    ("requirements", "expected"),
    [
        ([capacity("spot", "on-demand")], "default"),
        ([], "default"),  # no capacity-type requirement: every type, on-demand included
        ([capacity("on-demand")], "default"),
        ([capacity("spot")], None),
        ([capacity("on-demand", operator="NotIn")], None),
        ([capacity("spot", operator="NotIn")], "default"),
        ([{"key": "karpenter.sh/capacity-type", "operator": "Exists"}], "default"),
        ([{"key": "karpenter.sh/capacity-type", "operator": "DoesNotExist"}], None),
    ],
)
def test_the_capacity_type_requirement_decides(requirements: list[dict[str, Any]], expected: str | None) -> None:
    assert launches(pod(), pool(requirements)) == expected


def test_a_pod_pinned_to_a_custom_label_needs_a_pool_that_sets_it() -> None:
    pinned = pod(nodeSelector={"team": "batch"})
    assert launches(pinned, pool([capacity("on-demand")])) is None  # "label does not have known values"
    assert launches(pinned, pool([capacity("on-demand")], labels={"team": "batch"})) == "default"
    assert launches(pinned, pool([capacity("on-demand")], labels={"team": "web"})) is None
    # a NotIn or DoesNotExist on a label no pool sets is compatible
    away = pod(affinity=_required([{"key": "team", "operator": "NotIn", "values": ["web"]}]))
    assert launches(away, pool([capacity("on-demand")])) == "default"


def test_a_pod_pinned_to_a_nodepool_by_name_gets_only_that_one() -> None:
    pinned = pod(nodeSelector={"karpenter.sh/nodepool": "batch-spot"})
    spot_pool = pool([capacity("spot")], name="batch-spot")
    general = pool([capacity("spot", "on-demand")], name="general")
    assert launches(pinned, spot_pool, general) is None
    assert launches(pod(), spot_pool, general) == "general"


def test_well_known_labels_the_pool_leaves_open_are_allowed_and_intersected_when_set() -> None:
    zoned = pod(nodeSelector={"topology.kubernetes.io/zone": "us-east-1a"})
    assert launches(zoned, pool([capacity("on-demand")])) == "default"
    elsewhere = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}
    assert launches(zoned, pool([capacity("on-demand"), elsewhere])) is None
    beta = pod(nodeSelector={"failure-domain.beta.kubernetes.io/zone": "us-east-1a"})  # normalized
    assert launches(beta, pool([capacity("on-demand"), elsewhere])) is None
    big = {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["8"]}
    small = pod(affinity=_required([{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["4"]}]))
    assert launches(small, pool([capacity("on-demand"), big])) is None
    assert launches(small, pool([capacity("on-demand")])) == "default"


def test_any_required_term_will_do() -> None:
    terms = [
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["gone"]}]},
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]},
    ]
    p = pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    assert launches(p, pool([capacity("on-demand")])) == "default"


def test_the_template_taints_must_be_tolerated() -> None:
    tainted = pool([capacity("on-demand")], taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    assert launches(pod(), tainted) is None
    tolerant = pod(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}])
    assert launches(tolerant, tainted) == "default"
    soft = pool([capacity("on-demand")], taints=[{"key": "x", "effect": "PreferNoSchedule"}])
    assert launches(pod(), soft) == "default"


def test_a_pool_at_its_limits_not_ready_or_deleted_launches_nothing() -> None:
    assert launches(pod(), pool([], limits={"cpu": "0"})) is None
    used = {"resources": {"cpu": "65"}}
    assert launches(pod(), pool([], limits={"cpu": "64"}, status=used)) is None
    assert launches(pod(), pool([], limits={"cpu": "64"}, status={"resources": {"cpu": "32"}})) == "default"
    not_ready = {"conditions": [{"type": "Ready", "status": "False"}]}
    assert launches(pod(), pool([], status=not_ready)) is None
    assert not nodepools.any_on_demand([pool([], status=not_ready), pool([capacity("spot")])])
    assert nodepools.any_on_demand([pool([capacity("spot")]), pool([], name="od")])


def test_requirement_algebra_follows_karpenter() -> None:
    r = nodepools.Requirement.from_expression
    not_spot, od = r("NotIn", ["spot"]), r("In", ["on-demand"])
    assert not_spot and od and not_spot.intersects(od)
    assert not_spot.intersection(od) == nodepools.Requirement(False, frozenset({"on-demand"}))
    spot = r("In", ["spot"])
    assert spot and not not_spot.intersects(spot)
    gt, lt = r("Gt", ["4"]), r("Lt", ["6"])
    assert gt and lt and gt.intersects(lt) and gt.intersection(lt) == nodepools.Requirement(True, gte=5, lte=5)
    assert not (gt.intersects(r("Lt", ["5"]) or nodepools.IMPOSSIBLE))
    assert r("Bogus", ["x"]) is None


def _required(expressions: list[dict[str, Any]]) -> dict[str, Any]:
    terms = [{"matchExpressions": expressions}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
