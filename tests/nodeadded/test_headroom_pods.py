"""The headroom's placeholders as node-added writes them: where they may run, what admission makes of
them, and the PriorityClass every shipped shape carries."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from spotguard.nodeadded import headroom as keeper
from spotguard.policy import capacity, fit, headroom, placement
from spotguard.policy.config import Config
from spotguard.policy.headroom import Cover, Headroom
from spotguard.policy.views import PodView

from tests.infra import test_manifests as manifests
from tests.policy.builders import node

WANT = Headroom(Cover.LARGEST_NODE, count=3, cpu=1500, memory=256 * 2**20, wanted=3, pods=3, nodes=("spot-a",))


def placeholder(cfg: Config, namespace: str = "spotguard") -> PodView:
    """A pod of the Deployment's template, as its ReplicaSet creates it."""
    obj = keeper.deployment(WANT, cfg, namespace)
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "spotguard-headroom-abc-x1",
            "namespace": namespace,
            **obj["spec"]["template"]["metadata"],
            "ownerReferences": [{"kind": "ReplicaSet", "name": "spotguard-headroom-abc", "controller": True}],
        },
        "spec": obj["spec"]["template"]["spec"],
    }
    return PodView.from_json(pod)


KARPENTER_ON_DEMAND = {"karpenter.sh/capacity-type": "on-demand"}
NODES = {
    "karpenter on-demand": (KARPENTER_ON_DEMAND, True),
    "karpenter spot": ({"karpenter.sh/capacity-type": "spot"}, False),
    "eks spot": ({"eks.amazonaws.com/capacityType": "SPOT"}, False),
    "gke spot": ({"cloud.google.com/gke-spot": "true"}, False),
    "aks spot": ({"kubernetes.azure.com/scalesetpriority": "spot"}, False),
    "gke standard (no capacity label)": ({}, True),
    "aks regular": ({"kubernetes.azure.com/scalesetpriority": "regular"}, True),
}


@pytest.mark.parametrize("name", sorted(NODES))
def test_placeholders_may_run_on_on_demand_nodes_of_every_scheme_and_never_on_spot(name: str) -> None:
    labels, allowed = NODES[name]
    pod = placeholder(Config())
    assert fit.matches_required_affinity(pod, node("n", None, labels=labels)) is allowed
    assert (Config().node_capacity(labels) is capacity.Capacity.ON_DEMAND) is allowed


def test_placeholders_request_the_size_wanted_with_the_shipped_priority_class_and_no_disruption_guard() -> None:
    obj = keeper.deployment(WANT, Config(headroom_image="mirror.example.com/pause:3.10"), "spotguard")
    spec = obj["spec"]["template"]["spec"]
    assert obj["spec"]["replicas"] == 3
    assert spec["priorityClassName"] == headroom.PRIORITY_CLASS
    [container] = spec["containers"]
    assert container["image"] == "mirror.example.com/pause:3.10"
    assert container["resources"]["requests"] == {"cpu": "1500m", "memory": str(256 * 2**20)}
    assert "tolerations" not in spec
    annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
    assert "karpenter.sh/do-not-disrupt" not in annotations
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" not in annotations
    # no plan of spotguard's takes it for a workload
    assert obj["metadata"]["annotations"]["spotguard.io/enabled"] == "false"


def test_a_resource_nothing_at_risk_requests_is_left_out() -> None:
    obj = keeper.deployment(dataclasses.replace(WANT, memory=0), Config(), "spotguard")
    [container] = obj["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"cpu": "1500m"}


def test_the_admission_webhook_leaves_placeholders_alone_even_outside_the_excluded_namespaces() -> None:
    # in spotguard's namespace (excluded by default) ...
    assert placement.skip_reason(placeholder(Config()), Config()) == "namespace spotguard is excluded"
    # ... and where someone took that namespace off the list: the pod pins its capacity itself
    open_config = Config(excluded_namespaces=frozenset())
    assert placement.skip_reason(placeholder(open_config), open_config) == "the pod's spec already pins a capacity type"


def test_the_record_changes_with_the_template_not_with_the_pass() -> None:
    cfg = Config()
    first = keeper.record(WANT, keeper.template(WANT, cfg))
    assert first == keeper.record(WANT, keeper.template(WANT, cfg))
    other_image = keeper.record(WANT, keeper.template(WANT, Config(headroom_image="other/pause:1")))
    bigger = dataclasses.replace(WANT, cpu=2000)
    assert other_image != first and keeper.record(bigger, keeper.template(bigger, cfg)) != first


@pytest.mark.parametrize("source", ["kustomize", "helm"])
def test_every_shipped_shape_carries_the_priority_class_node_added_assumes(source: str) -> None:
    rendered = manifests.kustomize("kubernetes/base") if source == "kustomize" else manifests.helm()
    shipped = manifests.one(rendered, "PriorityClass", headroom.PRIORITY_CLASS)
    wanted = keeper.priority_class()
    for key in ("value", "preemptionPolicy", "globalDefault", "description"):
        assert shipped[key] == wanted[key], key
    assert shipped["value"] == headroom.PRIORITY < 0
