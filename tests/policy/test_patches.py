"""The admission patch: exact JSONPatch for typical pods, escaping, merging, idempotence."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jsonpatch
import pytest
from spotguard.policy import capacity, config, patches
from spotguard.policy.placement import Placement
from spotguard.policy.tolerations import Toleration
from spotguard.policy.workloads import MOVE_REQUIRES_SPOT

from tests.policy.builders import expr, pod_json, required

CFG = config.Config()
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
# "not spot under any scheme": one NotIn per default scheme, sorted by key
OD = [
    {"key": "cloud.google.com/gke-preemptible", "operator": "NotIn", "values": ["true"]},
    {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]},
    {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]},
    {"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "NotIn", "values": ["spot"]},
    {"key": "node.kubernetes.io/capacity", "operator": "NotIn", "values": ["spot"]},
]
# spot preferred under each scheme
SPOT_PREFS = [
    {"weight": 100, "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}}
    for key, value in [
        ("cloud.google.com/gke-preemptible", "true"),
        ("cloud.google.com/gke-spot", "true"),
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("karpenter.sh/capacity-type", "spot"),
        ("kubernetes.azure.com/scalesetpriority", "spot"),
        ("node.kubernetes.io/capacity", "spot"),
    ]
]
DEFAULT_TOLERATIONS = [
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-preemptible", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
]
ZONE = "topology.kubernetes.io/zone"


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(pod, ops)  # type: ignore[no-any-return]


def build_and_check(
    pod: dict[str, Any], placement: Placement, cfg: config.Config = CFG
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Build the patch, apply it, and check that patching again is a no-op."""
    before = copy.deepcopy(pod)
    ops = patches.build(pod, placement, cfg)
    assert pod == before, "build must not modify its input"
    patched = apply(pod, ops)
    assert patches.build(patched, placement, cfg) == []
    return ops, patched


def test_escape_and_pointer() -> None:
    assert patches.escape("spotguard.io/placement") == "spotguard.io~1placement"
    assert patches.escape("a~b/c") == "a~0b~1c"
    assert patches.pointer("metadata", "labels", "spotguard.io/placement") == (
        "/metadata/labels/spotguard.io~1placement"
    )
    assert patches.pointer("spec", "x", 0, "-") == "/spec/x/0/-"


def test_on_demand_plain_pod_exact() -> None:
    ops, patched = build_and_check(pod_json(labels={"app": "web"}), Placement.ON_DEMAND)
    assert ops == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [{"matchExpressions": OD}]}}},
        },
        {"op": "add", "path": "/metadata/labels/spotguard.io~1placement", "value": "on-demand"},
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {"controller.kubernetes.io/pod-deletion-cost": "1000000"},
        },
    ]
    assert patched["metadata"]["labels"] == {"app": "web", "spotguard.io/placement": "on-demand"}


def test_spot_plain_pod_exact() -> None:
    labels = {"app": "web", "pod-template-hash": "7d9f", "team.example.com/owner": "a~b"}
    ops, _ = build_and_check(pod_json(labels=labels), Placement.SPOT)
    selector = {"matchLabels": {"app": "web", "team.example.com/owner": "a~b"}}
    assert ops == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {PREF: SPOT_PREFS}},
        },
        {"op": "add", "path": "/spec/tolerations", "value": DEFAULT_TOLERATIONS},
        {
            "op": "add",
            "path": "/spec/topologySpreadConstraints",
            "value": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": selector,
                },
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": selector,
                },
            ],
        },
        {"op": "add", "path": "/metadata/labels/spotguard.io~1placement", "value": "spot"},
    ]


def test_user_terms_each_get_the_on_demand_expression() -> None:
    user_a = [expr(ZONE, "In", "a", "b")]
    fields = [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    spec = required(user_a)
    spec["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"].append({"matchFields": fields})
    spec["affinity"]["nodeAffinity"][PREF] = [
        {"weight": 5, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}}
    ]
    spec["affinity"]["podAntiAffinity"] = {
        PREF: [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                },
            }
        ]
    }
    pod = pod_json(spec=spec, annotations={"controller.kubernetes.io/pod-deletion-cost": "7"})
    ops, patched = build_and_check(pod, Placement.ON_DEMAND)
    base = "/spec/affinity/nodeAffinity/" + REQ + "/nodeSelectorTerms"
    assert ops == [
        *({"op": "add", "path": base + "/0/matchExpressions/-", "value": e} for e in OD),
        {"op": "add", "path": base + "/1/matchExpressions", "value": OD},
        {"op": "add", "path": "/metadata/labels/spotguard.io~1placement", "value": "on-demand"},
    ]  # the user's own deletion cost is kept
    affinity = patched["spec"]["affinity"]
    assert affinity["nodeAffinity"][REQ]["nodeSelectorTerms"] == [
        {"matchExpressions": [*user_a, *OD]},
        {"matchFields": fields, "matchExpressions": OD},
    ]
    assert affinity["nodeAffinity"][PREF] == spec["affinity"]["nodeAffinity"][PREF]
    assert affinity["podAntiAffinity"] == spec["affinity"]["podAntiAffinity"]


def test_empty_term_list_is_replaced() -> None:
    spec = {"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": []}}}}
    ops, _ = build_and_check(pod_json(spec=spec), Placement.ON_DEMAND)
    assert ops[0] == {
        "op": "replace",
        "path": "/spec/affinity/nodeAffinity/" + REQ + "/nodeSelectorTerms",
        "value": [{"matchExpressions": OD}],
    }


def test_spot_keeps_user_preferences_tolerations_and_spread() -> None:
    user_pref = {"weight": 10, "preference": {"matchExpressions": [expr(ZONE, "In", "a")]}}
    user_tol = {"key": "dedicated", "operator": "Equal", "value": "web", "effect": "NoSchedule"}
    user_spread = {
        "maxSkew": 2,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    spec = {
        "affinity": {"nodeAffinity": {PREF: [user_pref]}},
        "tolerations": [user_tol],
        "topologySpreadConstraints": [user_spread],
    }
    cfg = dataclasses.replace(CFG, spot_tolerations=(Toleration("capacity", "Equal", "spot", "NoSchedule"),))
    ops, patched = build_and_check(pod_json(spec=spec), Placement.SPOT, cfg)
    n = len(SPOT_PREFS)
    assert ops[: n + 2] == [
        *({"op": "add", "path": "/spec/affinity/nodeAffinity/" + PREF + "/-", "value": pref} for pref in SPOT_PREFS),
        {
            "op": "add",
            "path": "/spec/tolerations/-",
            "value": {"key": "capacity", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
        },
        {
            "op": "add",
            "path": "/spec/topologySpreadConstraints/-",
            "value": {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app": "web"}},
            },
        },
    ]
    assert patched["spec"]["affinity"]["nodeAffinity"][PREF][0] == user_pref
    assert patched["spec"]["tolerations"][0] == user_tol
    assert patched["spec"]["topologySpreadConstraints"][0] == user_spread  # zone: the user's


def test_configured_toleration_already_present_is_not_repeated() -> None:
    tol = Toleration("capacity", "Exists", effect="NoSchedule")
    cfg = dataclasses.replace(CFG, spot_tolerations=(tol,))
    spec = {"tolerations": [{"key": "capacity", "operator": "Exists", "effect": "NoSchedule"}]}
    ops, _ = build_and_check(pod_json(spec=spec), Placement.SPOT, cfg)
    assert not [op for op in ops if "tolerations" in op["path"]]


def test_pod_without_labels_or_annotations() -> None:
    raw = pod_json()
    del raw["metadata"]["labels"]
    ops, patched = build_and_check(raw, Placement.SPOT)
    assert {"op": "add", "path": "/metadata/labels", "value": {"spotguard.io/placement": "spot"}} in ops
    assert "topologySpreadConstraints" not in patched["spec"]  # nothing to select siblings by
    ops, patched = build_and_check(raw, Placement.ON_DEMAND)
    assert patched["metadata"]["annotations"] == {"controller.kubernetes.io/pod-deletion-cost": "1000000"}


def test_changed_placement_label_is_replaced() -> None:
    raw = pod_json(labels={"app": "web", "spotguard.io/placement": "spot"})
    ops, _ = build_and_check(raw, Placement.ON_DEMAND)
    assert {"op": "replace", "path": "/metadata/labels/spotguard.io~1placement", "value": "on-demand"} in ops


def test_no_deletion_cost_when_configured_off() -> None:
    cfg = dataclasses.replace(CFG, on_demand_deletion_cost=0)
    ops, _ = build_and_check(pod_json(), Placement.ON_DEMAND, cfg)
    assert not [op for op in ops if "annotations" in op["path"]]


def test_spot_only_scheme_uses_not_in_for_on_demand() -> None:
    gke = capacity.scheme("cloud.google.com/gke-spot", ["true"])
    cfg = dataclasses.replace(CFG, label_schemes=(gke,))
    ops, _ = build_and_check(pod_json(), Placement.ON_DEMAND, cfg)
    terms = ops[0]["value"]["nodeAffinity"][REQ]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]}]}
    ]
    ops, _ = build_and_check(pod_json(), Placement.SPOT, cfg)
    assert ops[0]["value"]["nodeAffinity"][PREF][0]["preference"]["matchExpressions"] == [
        {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]}
    ]


def test_unknown_capacity_as_spot_requires_on_demand_under_some_scheme_in_each_user_term() -> None:
    """Terms are ORed: each user term is crossed with each scheme that has on-demand values."""
    cfg = dataclasses.replace(CFG, unknown_capacity=capacity.Capacity.SPOT)
    user = [expr(ZONE, "In", "a")]
    _, patched = build_and_check(pod_json(spec=required(user)), Placement.ON_DEMAND, cfg)
    terms = patched["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]
    on_demand_keys = [
        "eks.amazonaws.com/capacityType",
        "karpenter.sh/capacity-type",
        "kubernetes.azure.com/scalesetpriority",
        "node.kubernetes.io/capacity",
    ]
    assert len(terms) == len(on_demand_keys)
    for term, key in zip(terms, on_demand_keys, strict=True):
        assert term["matchExpressions"][: len(user) + len(OD)] == [*user, *OD]
        assert term["matchExpressions"][-1]["key"] == key and term["matchExpressions"][-1]["operator"] == "In"


@pytest.mark.parametrize("placement", list(Placement))
def test_spread_keys_configurable(placement: Placement) -> None:
    cfg = dataclasses.replace(CFG, spread_topology_keys=())
    _, patched = build_and_check(pod_json(), placement, cfg)
    assert "topologySpreadConstraints" not in patched["spec"]


def test_a_surge_replica_is_marked_and_gets_no_deletion_cost() -> None:
    """An on-demand slot of a surge in progress: the same requirement, marked as a surge
    replica, and no deletion cost (an extra: the scale back removes it after the dead pods,
    not the spot pods of a node that lives on); patching again is a no-op."""
    before = pod_json(labels={"app": "web"})
    ops = patches.build(before, Placement.ON_DEMAND, CFG, surge=True)
    patched = apply(before, ops)
    assert patches.build(patched, Placement.ON_DEMAND, CFG, surge=True) == []
    assert patched["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"] == [{"matchExpressions": OD}]
    assert patched["metadata"]["annotations"] == {
        "spotguard.io/surge-replica": "true",
        **PROTECTED,
        "spotguard.io/surge-protected": "cluster-autoscaler.kubernetes.io/safe-to-evict,karpenter.sh/do-not-disrupt",
    }
    plain = apply(before, patches.build(before, Placement.ON_DEMAND, CFG))
    assert plain["metadata"]["annotations"] == {"controller.kubernetes.io/pod-deletion-cost": "1000000"}


PROTECTED = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


def test_a_surge_replica_is_protected_from_the_autoscalers_until_the_surge_ends() -> None:
    """While the surge is needed neither Karpenter's consolidation nor the Cluster
    Autoscaler's scale-down may move it; the finish removes exactly what spotguard set
    (a key the pod's template already carried is the owner's and stays)."""
    owned = pod_json(annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"})
    patched = apply(owned, patches.build(owned, Placement.ON_DEMAND, CFG, surge=True))
    notes = patched["metadata"]["annotations"]
    assert notes["karpenter.sh/do-not-disrupt"] == "true"
    assert notes["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"  # the owner's choice
    undo = patches.surge_unprotection(notes)
    assert undo == {"karpenter.sh/do-not-disrupt": None, "spotguard.io/surge-protected": None}
    after = {k: v for k, v in notes.items() if k not in undo}
    assert after == {"spotguard.io/surge-replica": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
    assert patches.surge_unprotection(after) == {}
    # not a surge slot: no protection
    spot = apply(owned, patches.build(owned, Placement.SPOT, CFG))
    assert "karpenter.sh/do-not-disrupt" not in spot["metadata"]["annotations"]


def test_a_statefulset_pod_that_is_all_floor_is_kept_from_the_autoscalers_for_good() -> None:
    """A StatefulSet whose every replica is its floor (cache: 1 replica, floor 1): no drain can
    take its pod without breaking the floor, so neither autoscaler may pick its node; the keys
    the template already carries are the owner's; the ranked deletion cost still follows."""
    before = pod_json(annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"})
    patched = apply(before, patches.build(before, Placement.ON_DEMAND, CFG, keep=True))
    notes = patched["metadata"]["annotations"]
    assert notes["karpenter.sh/do-not-disrupt"] == "true"
    assert notes["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"  # the owner's choice
    assert notes["spotguard.io/floor-protected"] == "karpenter.sh/do-not-disrupt"
    assert notes["controller.kubernetes.io/pod-deletion-cost"] == "1000000"
    assert patches.build(patched, Placement.ON_DEMAND, CFG, keep=True) == []
    # a pod with no annotations at all gets the map made
    bare = pod_json()
    done = apply(bare, patches.build(bare, Placement.ON_DEMAND, CFG, keep=True))
    assert {k: done["metadata"]["annotations"][k] for k in PROTECTED} == PROTECTED
    # not kept: nothing of it
    plain = apply(bare, patches.build(bare, Placement.ON_DEMAND, CFG))
    assert "karpenter.sh/do-not-disrupt" not in plain["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("kind", "replicas", "annotations", "kept"),
    [
        ("StatefulSet", 1, {}, True),  # quorum of 1 is 1
        ("StatefulSet", 2, {}, True),  # quorum of 2 is 2
        ("StatefulSet", 3, {}, False),  # quorum 2 of 3: one pod may go
        ("StatefulSet", 3, {"spotguard.io/min-on-demand": "3"}, True),
        ("StatefulSet", 2, {"spotguard.io/min-on-demand": "1"}, False),
        ("StatefulSet", 1, {"spotguard.io/enabled": "false"}, False),
        ("StatefulSet", 0, {}, False),
        ("Deployment", 1, {}, False),  # replaced before it goes (the drain surge)
    ],
)
def test_every_pod_is_floor(kind: str, replicas: int, annotations: dict[str, str], kept: bool) -> None:
    from spotguard.policy import floors
    from spotguard.policy.workloads import Kind, Workload

    w = Workload(Kind(kind), "data", "cache", replicas, annotations)
    assert floors.every_pod_is_floor(w, floors.floor_for(w, CFG, replicas=max(replicas, 1))) is kept


# -- the spread keeps to spot nodes where the cluster has a spot-only key ----------------

GKE_SPOT = {"cloud.google.com/gke-spot": "true", "topology.kubernetes.io/zone": "a"}
GKE_STANDARD = {"cloud.google.com/gke-nodepool": "default-pool"}
AKS_SPOT = {"kubernetes.azure.com/scalesetpriority": "spot"}
AKS_REGULAR = {"kubernetes.azure.com/agentpool": "regular"}
EKS_SPOT = {"eks.amazonaws.com/capacityType": "SPOT"}
EKS_OD = {"eks.amazonaws.com/capacityType": "ON_DEMAND"}
SG_SPOT = patches.SPOT_NODE_LABEL


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([GKE_SPOT, GKE_STANDARD], "cloud.google.com/gke-spot"),
        ([{"cloud.google.com/gke-preemptible": "true"}, GKE_STANDARD], "cloud.google.com/gke-preemptible"),
        ([AKS_SPOT, AKS_REGULAR], "kubernetes.azure.com/scalesetpriority"),
        # every on-demand node carries the key too: none
        ([EKS_SPOT, EKS_OD], None),
        ([{"karpenter.sh/capacity-type": "spot"}, {"karpenter.sh/capacity-type": "on-demand"}], None),
        # spot nodes of two providers share no key: none
        ([GKE_SPOT, AKS_SPOT, GKE_STANDARD], None),
        # no spot node: none
        ([GKE_STANDARD, AKS_REGULAR], None),
        # an AKS regular pool explicitly labelled regular carries the key: none
        ([AKS_SPOT, {"kubernetes.azure.com/scalesetpriority": "regular"}], None),
        # node-added's label on every spot node and no other: that key
        ([{**EKS_SPOT, SG_SPOT: "true"}, EKS_OD], SG_SPOT),
        ([{**EKS_SPOT, SG_SPOT: "true"}, {**EKS_SPOT, SG_SPOT: "true"}, EKS_OD], SG_SPOT),
        # ... but a spot node not labelled yet, or an on-demand node labelled: none
        ([{**EKS_SPOT, SG_SPOT: "true"}, EKS_SPOT, EKS_OD], None),
        ([{**EKS_SPOT, SG_SPOT: "true"}, {**EKS_OD, SG_SPOT: "true"}], None),
        # the provider's own key first
        ([{**GKE_SPOT, SG_SPOT: "true"}, GKE_STANDARD], "cloud.google.com/gke-spot"),
    ],
)
def test_spot_only_key(nodes: list[dict[str, str]], expected: str | None) -> None:
    assert patches.spot_only_key(nodes, CFG) == expected


def test_a_spot_slot_spreads_over_the_spot_only_key_too() -> None:
    ops = patches.build(pod_json(), Placement.SPOT, CFG, spot_key="cloud.google.com/gke-spot")
    patched = jsonpatch.apply_patch(pod_json(), ops)
    keys = [c["topologyKey"] for c in patched["spec"]["topologySpreadConstraints"]]
    assert keys == ["kubernetes.io/hostname", ZONE, "cloud.google.com/gke-spot"]
    assert {c["whenUnsatisfiable"] for c in patched["spec"]["topologySpreadConstraints"]} == {"ScheduleAnyway"}
    # reinvocation adds nothing, with or without the key
    assert patches.build(patched, Placement.SPOT, CFG, spot_key="cloud.google.com/gke-spot") == []
    assert patches.build(patched, Placement.SPOT, CFG) == []


def test_spot_node_labels_set_on_spot_nodes_and_removed_elsewhere() -> None:
    nodes = [
        ("spot-new", EKS_SPOT),
        ("spot-done", {**EKS_SPOT, SG_SPOT: "true"}),
        ("spot-odd", {**EKS_SPOT, SG_SPOT: "yes"}),
        ("od", EKS_OD),
        ("od-labelled", {**EKS_OD, SG_SPOT: "true"}),
        ("unknown", {}),
    ]
    assert patches.spot_node_labels(nodes, CFG) == {"spot-new": "true", "spot-odd": "true", "od-labelled": None}


def test_a_moves_new_replica_requires_spot_and_keeps_its_preferences() -> None:
    """A spot slot for a move back to spot (spotguard.policy.moves.launching) requires spot, ANDed
    into the user's terms, on the keys the cluster's nodes carry, and the preferences and the
    requirement both survive the patch (both add /spec/affinity to a bare pod)."""
    import jsonpatch

    cfg = config.Config()
    bare = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c"}]}}
    ops = patches.build(bare, Placement.SPOT, cfg, require_spot=True, node_keys={"karpenter.sh/capacity-type"})
    out = jsonpatch.apply_patch(bare, ops)
    affinity = out["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}
    ]
    assert len(affinity["preferredDuringSchedulingIgnoredDuringExecution"]) == len(patches.spot_preferences(cfg))
    # with a user's own term: ANDed into it
    user = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
    pinned = {**bare, "spec": {**bare["spec"], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [user]}}}}}
    out = jsonpatch.apply_patch(pinned, patches.build(pinned, Placement.SPOT, cfg, require_spot=True,
                                                      node_keys={"karpenter.sh/capacity-type"}))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        *user["matchExpressions"], {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}]
    # and again: nothing more to add to the spec (reinvocation)
    again = patches.build(out, Placement.SPOT, cfg, require_spot=True, node_keys={"karpenter.sh/capacity-type"})
    assert not [op for op in again if op["path"].startswith("/spec")]


def test_a_moves_new_replica_is_marked_with_its_move() -> None:
    """The requirement comes with spotguard's mark naming the move (what node-added reads to
    take the pod if it is still Pending once the move is over: a user's spot pin has none);
    beside an annotation the pod has, or one the patch adds (the deletion cost's op after it
    must not replace the map)."""
    cfg = config.Config()
    for theirs in ({}, {"team": "a"}):
        pod = {"metadata": {"labels": {"app": "web"}, **({"annotations": theirs} if theirs else {})},
               "spec": {"containers": [{"name": "c"}]}}  # fmt: skip
        ops = patches.build(pod, Placement.SPOT, cfg, require_spot=True, cost=5, move="1800000000.000")
        out = jsonpatch.apply_patch(pod, ops)
        assert out["metadata"]["annotations"] == {
            **theirs,
            MOVE_REQUIRES_SPOT: "1800000000.000",
            "controller.kubernetes.io/pod-deletion-cost": "5",
        }
        again = patches.build(out, Placement.SPOT, cfg, require_spot=True, cost=5, move="1800000000.000")
        assert not [op for op in again if op["path"].startswith("/metadata")]
    # no mark without the requirement
    plain = {"metadata": {}, "spec": {"containers": [{"name": "c"}]}}
    out = jsonpatch.apply_patch(plain, patches.build(plain, Placement.SPOT, cfg, move="1800000000.000"))
    assert MOVE_REQUIRES_SPOT not in (out["metadata"].get("annotations") or {})
