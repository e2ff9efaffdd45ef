"""The admission patch's node affinity against every provider's labels: unit and property tests.

GIVEN a node's labels (EKS managed node groups, Karpenter incl. ``reserved``,
GKE spot pools and standard pools without a capacity label, AKS spot and
regular pools, the generic label, and mixtures of all of them), the on-demand
requirement matches the node exactly when it is not spot under any scheme
(and, when unknown capacity counts as spot, on-demand under one), and a spot
preference matches exactly the spot nodes.
"""

from __future__ import annotations

import dataclasses

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st
from spotguard.policy import capacity, config, fit, patches
from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement
from spotguard.policy.tolerations import Taint
from spotguard.policy.views import NodeView, PodView

from tests.policy.builders import expr, pod_json, required

CFG = config.Config()
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"

PROVIDER_NODES = [
    # (labels, capacity)
    ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, Capacity.ON_DEMAND),
    ({"eks.amazonaws.com/capacityType": "SPOT"}, Capacity.SPOT),
    ({"karpenter.sh/capacity-type": "on-demand"}, Capacity.ON_DEMAND),
    ({"karpenter.sh/capacity-type": "reserved"}, Capacity.ON_DEMAND),
    ({"karpenter.sh/capacity-type": "spot"}, Capacity.SPOT),
    ({"cloud.google.com/gke-nodepool": "default-pool"}, Capacity.ON_DEMAND),  # GKE standard: no label
    ({"cloud.google.com/gke-spot": "true"}, Capacity.SPOT),
    ({"cloud.google.com/gke-preemptible": "true"}, Capacity.SPOT),
    ({"kubernetes.azure.com/agentpool": "system"}, Capacity.ON_DEMAND),  # AKS regular: no label
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, Capacity.SPOT),
    ({"node.kubernetes.io/capacity": "on-demand"}, Capacity.ON_DEMAND),
    ({"node.kubernetes.io/capacity": "spot"}, Capacity.SPOT),
    ({"karpenter.sh/capacity-type": "spot", "eks.amazonaws.com/capacityType": "SPOT"}, Capacity.SPOT),
    ({"karpenter.sh/capacity-type": "on-demand", "node.kubernetes.io/capacity": "spot"}, Capacity.SPOT),
]


def node(labels: dict[str, str], taints: tuple[Taint, ...] = ()) -> NodeView:
    return NodeView(name="n", labels=labels, taints=taints)


def patched_view(placement: Placement, cfg: config.Config = CFG, spec: dict | None = None) -> PodView:
    raw = pod_json(labels={"app": "web"}, spec=spec)
    return PodView.from_json(jsonpatch.apply_patch(raw, patches.build(raw, placement, cfg)))


@pytest.mark.parametrize(("labels", "expected"), PROVIDER_NODES)
def test_default_settings_place_on_demand_slots_on_on_demand_nodes_of_every_scheme(
    labels: dict[str, str], expected: Capacity
) -> None:
    on_demand_pod = patched_view(Placement.ON_DEMAND)
    assert fit.matches_required_affinity(on_demand_pod, node(labels)) is (expected is Capacity.ON_DEMAND)
    spot_pod = patched_view(Placement.SPOT)
    weight = sum(
        t["weight"]
        for t in spot_pod.spec["affinity"]["nodeAffinity"][PREF]
        if fit.term_matches(t["preference"], node(labels))
    )
    assert (weight > 0) is (expected is Capacity.SPOT)


def test_a_spot_slot_tolerates_the_aks_spot_taint_by_default() -> None:
    aks_spot = node(
        {"kubernetes.azure.com/scalesetpriority": "spot"},
        (Taint("kubernetes.azure.com/scalesetpriority", "spot", "NoSchedule"),),
    )
    assert fit.check(patched_view(Placement.SPOT), aks_spot).ok
    assert not fit.check(patched_view(Placement.ON_DEMAND), aks_spot).ok


def test_the_on_demand_requirement_is_anded_into_a_node_pool_pin() -> None:
    spec = required([expr("karpenter.sh/nodepool", "In", "general")])
    pod = patched_view(Placement.ON_DEMAND, spec=spec)
    assert fit.matches_required_affinity(pod, node({"karpenter.sh/nodepool": "general"}))
    assert not fit.matches_required_affinity(
        pod, node({"karpenter.sh/nodepool": "general", "karpenter.sh/capacity-type": "spot"})
    )
    assert not fit.matches_required_affinity(pod, node({"karpenter.sh/nodepool": "batch"}))


def test_within_reach_judges_a_pin_by_the_nodes_it_matches() -> None:
    nodes = [
        node({"karpenter.sh/nodepool": "batch-spot", "karpenter.sh/capacity-type": "spot"}),
        node({"karpenter.sh/nodepool": "general", "karpenter.sh/capacity-type": "on-demand"}),
        node({"karpenter.sh/nodepool": "general", "karpenter.sh/capacity-type": "spot"}),
    ]
    pinned = PodView.from_json(pod_json(spec={"nodeSelector": {"karpenter.sh/nodepool": "batch-spot"}}))
    assert fit.within_reach(pinned, nodes, CFG) == {Capacity.SPOT}
    general = PodView.from_json(pod_json(spec=required([expr("karpenter.sh/nodepool", "In", "general")])))
    assert fit.within_reach(general, nodes, CFG) == {Capacity.SPOT, Capacity.ON_DEMAND}
    nowhere = PodView.from_json(pod_json(spec={"nodeSelector": {"karpenter.sh/nodepool": "gpu"}}))
    assert fit.within_reach(nowhere, nodes, CFG) == frozenset()
    # a pool taint the pod does not tolerate keeps its nodes out of reach
    tainted = [node({"pool": "db"}, (Taint("dedicated", "db", "NoSchedule"),))]
    assert fit.within_reach(PodView.from_json(pod_json()), tainted, CFG) == frozenset()
    # ... but a cordon or a notice does not: they come and go
    cordoned = [node({}, (Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),))]
    assert fit.within_reach(PodView.from_json(pod_json()), cordoned, CFG) == {Capacity.ON_DEMAND}


# -- properties --------------------------------------------------------------------------

SCHEME_VALUES = {
    "node.kubernetes.io/capacity": ["spot", "on-demand", "reserved", "Spot", ""],
    "karpenter.sh/capacity-type": ["spot", "on-demand", "reserved", "SPOT"],
    "eks.amazonaws.com/capacityType": ["SPOT", "ON_DEMAND", "spot", "CAPACITY_BLOCK"],
    "cloud.google.com/gke-spot": ["true", "false", "True"],
    "cloud.google.com/gke-preemptible": ["true", "false"],
    "kubernetes.azure.com/scalesetpriority": ["spot", "regular", "Spot"],
    "kubernetes.io/hostname": ["n1"],
    "cloud.google.com/gke-nodepool": ["default-pool", "spot-pool"],
}

label_sets = st.dictionaries(st.sampled_from(sorted(SCHEME_VALUES)), st.none(), max_size=len(SCHEME_VALUES)).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(SCHEME_VALUES[k]) for k in keys})
)

custom_schemes = st.lists(
    st.tuples(
        st.sampled_from(["a/cap", "b/cap", "c/cap"]),
        st.sets(st.sampled_from(["s1", "s2"]), min_size=1),
        st.sets(st.sampled_from(["o1", "o2"])),
    ),
    min_size=1,
    max_size=4,
).map(lambda items: tuple(capacity.scheme(k, s, o) for k, s, o in items))

custom_labels = st.dictionaries(
    st.sampled_from(["a/cap", "b/cap", "c/cap", "other"]), st.sampled_from(["s1", "s2", "o1", "o2", "x"])
)


def _matches_on_demand(cfg: config.Config, labels: dict[str, str]) -> bool:
    return any(fit.term_matches({"matchExpressions": term}, node(labels)) for term in patches.on_demand_terms(cfg))


def _spot_under_any(cfg: config.Config, labels: dict[str, str]) -> bool:
    return any(s.classify(labels) is Capacity.SPOT for s in cfg.label_schemes)


@given(labels=label_sets)
def test_with_defaults_a_node_matches_the_on_demand_requirement_iff_it_is_not_spot_under_any_scheme(
    labels: dict[str, str],
) -> None:
    assert _matches_on_demand(CFG, labels) is not _spot_under_any(CFG, labels)
    assert _matches_on_demand(CFG, labels) is (CFG.node_capacity(labels) is Capacity.ON_DEMAND)


@given(
    labels=st.one_of(label_sets, custom_labels),
    schemes=st.one_of(st.just(capacity.DEFAULT_SCHEMES), custom_schemes),
    unknown=st.sampled_from([Capacity.ON_DEMAND, Capacity.SPOT]),
)
def test_the_on_demand_requirement_matches_exactly_the_nodes_that_count_as_on_demand(
    labels: dict[str, str], schemes: tuple[capacity.LabelScheme, ...], unknown: Capacity
) -> None:
    cfg = dataclasses.replace(CFG, label_schemes=schemes, unknown_capacity=unknown)
    assert _matches_on_demand(cfg, labels) is (cfg.node_capacity(labels) is Capacity.ON_DEMAND)


@given(
    labels=st.one_of(label_sets, custom_labels), schemes=st.one_of(st.just(capacity.DEFAULT_SCHEMES), custom_schemes)
)
def test_a_spot_preference_matches_exactly_the_spot_nodes(
    labels: dict[str, str], schemes: tuple[capacity.LabelScheme, ...]
) -> None:
    cfg = dataclasses.replace(CFG, label_schemes=schemes)
    prefers = any(fit.term_matches(t["preference"], node(labels)) for t in patches.spot_preferences(cfg))
    assert prefers is _spot_under_any(cfg, labels)
    assert prefers is (capacity.classify(labels, schemes) is Capacity.SPOT)
