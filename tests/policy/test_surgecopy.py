"""The surge copy (issue 24): a ReplicaSet of spotguard's that no controller adopts,
whose pods every selector of the Deployment's sees, pinned to on-demand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from spotguard.policy import config, patches, surgecopy
from spotguard.policy.capacity import Capacity
from spotguard.policy.interruption import selector_matches
from spotguard.policy.surgecopy import Refusal
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import (
    PLACEMENT_LABEL,
    SURGE_OF,
    SURGE_REPLICA,
    surge_copy_name,
    surge_deployment,
    surge_of_label,
)
from spotguard_sim import patching

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
    pod_annotations = rs["spec"]["template"]["metadata"]["annotations"]
    assert surge_deployment(pod_labels, pod_annotations) == "web"
    assert surge_deployment(dep["spec"]["template"]["metadata"]["labels"], {}) is None
    assert surgecopy.copy_of(rs) == "web"
    assert surgecopy.copy_of({**rs, "metadata": {**rs["metadata"], "name": "x"}}) is None  # not its copy's name


@pytest.mark.parametrize("length", [63, 64, 100, 237, 238, 253])
def test_a_long_deployment_name_gets_a_copy_the_api_takes_and_the_functions_recognize(length: int) -> None:
    """A Deployment's name may have 253 characters, a label value 63 and the copy's name 253:
    past them the label holds the name's start and a digest, the copy's name is cut with the
    digest, and the whole name rides on SURGE_FOR (the copy's and its pods')."""
    name = ("web-" + "a" * 300)[:length]
    dep = deployment()
    dep["metadata"]["name"] = name
    rs = built(dep)
    meta, tmeta = rs["metadata"], rs["spec"]["template"]["metadata"]
    assert len(meta["name"]) <= 253 and len(meta["labels"][SURGE_OF]) <= 63
    assert tmeta["labels"][SURGE_OF] == meta["labels"][SURGE_OF] == rs["spec"]["selector"]["matchLabels"][SURGE_OF]
    assert surgecopy.copy_of(rs) == name
    assert surge_deployment(tmeta["labels"], tmeta["annotations"]) == name
    assert (meta["name"] == surgecopy.PREFIX + name) is (length <= 237)
    # Two long names that begin alike get two copies and two labels.
    other = name[:-1] + "b"
    assert surge_copy_name(other) != surge_copy_name(name)
    assert (surge_of_label(other) != surge_of_label(name)) or length <= 63


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
    assert rs["spec"]["template"]["metadata"]["annotations"] == {
        "a": "b",
        SURGE_REPLICA: "true",
        surgecopy.SURGE_FOR: "Deployment/web",
        **patches.surge_protection({}),  # test_the_copys_pods_keep_their_nodes_from_the_node_autoscalers
    }


def test_the_copys_pods_require_on_demand() -> None:
    rs = built(deployment())
    terms = rs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][patches.REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": patches.on_demand_terms(CFG)[0]}]


def test_a_copy_whose_surge_needs_no_on_demand_is_made_of_spot_slots() -> None:
    """A surge replacing pods an autoscaler only drains (SurgeRecord.on_demand_surge == 0):
    the copy's pods are spot slots, as the admission patch makes them (spot preferred, no
    on-demand requirement, spread with the Deployment's own pods), labelled so."""
    dep = deployment()
    before = copy.deepcopy(dep)
    out = surgecopy.build(dep, 2, CFG, on_demand=False, spot_key="spotguard.io/spot")
    assert not isinstance(out, Refusal), out
    template = out["spec"]["template"]
    spec = template["spec"]
    assert patches.REQUIRED not in spec.get("affinity", {}).get("nodeAffinity", {})
    assert spec["affinity"]["nodeAffinity"][patches.PREFERRED] == patches.spot_preferences(CFG)
    spread = spec["topologySpreadConstraints"]
    assert spread and all(c["labelSelector"] == {"matchLabels": {"app": "web", "tier": "front"}} for c in spread)
    assert "spotguard.io/spot" in {c["topologyKey"] for c in spread}
    assert template["metadata"]["labels"] == {"app": "web", "tier": "front", SURGE_OF: "web", PLACEMENT_LABEL: "spot"}
    # the same spec as the webhook gives a pod of the Deployment placed as a spot slot
    own = {"metadata": {"labels": {"app": "web", "tier": "front"}}, "spec": dep["spec"]["template"]["spec"]}
    assert spec == patches.spot_slot_spec(own, CFG, "spotguard.io/spot")
    # its selector still adds SURGE_OF only: the placement label is no part of it
    assert out["spec"]["selector"] == {"matchLabels": {"app": "web", SURGE_OF: "web"}}
    assert dep == before


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


def test_a_copy_of_no_pod_holds_its_record() -> None:
    """A surge in progress that needs no pod keeps its copy at 0: the copy holds the record."""
    record = SurgeRecord(replicas=3, surge=1, events=("e",), nodes=("n",), started=1.0, copy=True)
    out = surgecopy.build(deployment(), 0, CFG, record=record)
    assert isinstance(out, dict) and out["spec"]["replicas"] == 0
    assert surgecopy.record_of(out) == record
    assert isinstance(surgecopy.build(deployment(), -1, CFG), Refusal)


# --- the copy's life -------------------------------------------------------------------

T = 1000.0  # the last doomed node's reclaim time


def facts(**kw: Any) -> surgecopy.CopyFacts:
    base: dict[str, Any] = {
        "replicas_now": 4,
        "ready_before": 4,
        "own_ready_staying": 2,
        "own_on_doomed": 2,
        "copy_replicas": None,
        "last_deadline": T,
        "now": T - 110,
    }
    base.update(kw)
    return surgecopy.CopyFacts(**base)


A, S = surgecopy.Action, surgecopy.CopyState


@pytest.mark.parametrize(
    ("kw", "state", "action", "replicas"),
    [
        # a notice: two of four on a doomed node -> a copy of two stands in for them
        ({}, S.COVERING, A.CREATE, 2),
        ({"copy_replicas": 2}, S.COVERING, A.KEEP, 2),
        # a drainer evicted one doomed pod and the Deployment's replacement is Ready elsewhere
        ({"copy_replicas": 2, "own_ready_staying": 3, "own_on_doomed": 1}, S.COVERING, A.RESIZE, 1),
        # GitOps reverts / a replace / the HPA lowers the owner's count to 2: nothing to cover
        ({"copy_replicas": 2, "replicas_now": 2}, S.COVERING, A.DELETE, 0),
        # the owner raised the count: the surge never serves above the pre-notice count
        ({"copy_replicas": 2, "replicas_now": 6}, S.COVERING, A.KEEP, 2),
        # the reclaim came: the copy waits for the Deployment's own replacements
        ({"copy_replicas": 2, "own_on_doomed": 0, "now": T + 5}, S.HANDING_BACK, A.KEEP, 2),
        ({"copy_replicas": 2, "own_on_doomed": 2, "now": T + 5}, S.HANDING_BACK, A.KEEP, 2),
        ({"copy_replicas": 2, "own_on_doomed": 0, "own_ready_staying": 3, "now": T + 30}, S.HANDING_BACK, A.RESIZE, 1),
        # a copy lost (deleted by someone) while replacements are still missing: made again
        ({"copy_replicas": None, "own_on_doomed": 0, "now": T + 30}, S.HANDING_BACK, A.CREATE, 2),
        # the Deployment serves its count again on nodes that stay: the copy goes
        ({"copy_replicas": 1, "own_on_doomed": 0, "own_ready_staying": 4, "now": T + 60}, S.DONE, A.DELETE, 0),
        ({"copy_replicas": None, "own_on_doomed": 0, "own_ready_staying": 4, "now": T + 60}, S.DONE, A.NOTHING, 0),
        # no replacement within the grace (no capacity for them): the copy goes, said why
        ({"copy_replicas": 2, "own_on_doomed": 0, "now": T + surgecopy.HANDBACK_GRACE}, S.DONE, A.DELETE, 0),
        # an old record without the Ready count: the owner's count now is the count to keep
        ({"ready_before": 0, "replicas_now": 3}, S.COVERING, A.CREATE, 1),
        # a later warning dooms the node of two of the copy's own pods (spot slots): each
        # gets a replacement now, not once the reclaim has taken it
        ({"copy_replicas": 2, "own_on_doomed": 0, "copy_on_doomed": 2}, S.COVERING, A.RESIZE, 4),
        ({"copy_replicas": 2, "own_on_doomed": 2, "copy_on_doomed": 1}, S.COVERING, A.RESIZE, 3),
        # ... unless the Deployment's own pods on nodes that stay serve the count already
        ({"copy_replicas": 1, "own_ready_staying": 4, "own_on_doomed": 0, "copy_on_doomed": 1},
         S.COVERING, A.DELETE, 0),
    ],
)
def test_each_transition_of_the_copy(kw: dict[str, Any], state: Any, action: Any, replicas: int) -> None:
    step = surgecopy.copy_step(facts(**kw))
    assert (step.state, step.action, step.replicas) == (state, action, replicas), step.reason


@pytest.mark.parametrize(("asked", "found", "size"), [(3, 1, 3), (1, 3, None), (2, 2, None)])
def test_a_copy_found_made_since_the_read_is_only_grown(asked: int, found: int, size: int | None) -> None:
    """A pass whose create answered AlreadyExists counted on a read older than the copy:
    its count may be stale (a record since extended to more doomed nodes), so it may grow
    the copy but never shrink it."""
    assert surgecopy.size_of_found_copy(asked, found) == size


def test_the_wait_that_ran_out_says_so() -> None:
    step = surgecopy.copy_step(facts(copy_replicas=2, own_on_doomed=0, now=T + 400))
    assert "waited 300s" in step.reason and "2 of 4" in step.reason


def test_the_copys_pods_are_the_deployments_replicas_but_not_its_own() -> None:
    from spotguard.policy.workloads import Kind, Workload

    from tests.policy.builders import pod

    wl = Workload(Kind.DEPLOYMENT, "shop", "web", replicas=4)
    owners = {("shop", "web-7d9f"): "web"}
    copy_labels = {"app": "web", SURGE_OF: "web"}
    pods = [
        pod("web-a", node_name="spot-1"),  # own, on the doomed node
        pod("web-b", node_name="spot-1", ready=False),
        pod("web-c", node_name="od-1"),  # own, on a node that stays
        pod("web-d", node_name="spot-2", ready=False),
        pod("c-1", node_name="od-2", labels=copy_labels, owner=("ReplicaSet", "spotguard-surge-web")),
        pod("c-2", node_name="od-2", labels=copy_labels, owner=("ReplicaSet", "spotguard-surge-web")),
        pod("x-1", node_name="od-2", labels=copy_labels, owner=("ReplicaSet", "someone-else")),
    ]
    assert [surgecopy.workload_of_copy_pod(p) for p in pods] == [None] * 4 + ["Deployment/shop/web"] * 2 + [None]
    f = surgecopy.facts_for(
        wl,
        4,
        pods,
        doomed={"spot-1"},
        live_doomed={"spot-1"},
        copy_replicas=2,
        last_deadline=T,
        now=T - 60,
        replicaset_owners=owners,
    )
    assert (f.own_ready_staying, f.own_on_doomed, f.copy_replicas) == (1, 2, 2)
    assert surgecopy.copy_step(f).replicas == 3  # 4 to keep, 1 Ready on nodes that stay
    # A later warning for od-2 (where the copy's two pods run): each needs a replacement.
    later = surgecopy.facts_for(
        wl, 4, pods, doomed={"spot-1", "od-2"}, live_doomed={"spot-1", "od-2"}, copy_replicas=2,
        last_deadline=T, now=T - 60, replicaset_owners=owners,
    )
    assert (later.own_ready_staying, later.copy_on_doomed) == (1, 2)
    assert surgecopy.copy_step(later).replicas == 5


def test_the_webhook_leaves_the_copys_pods_where_their_template_pins_them() -> None:
    # The pods need no decision of the webhook's: on-demand even while it is down (fail open).
    from spotguard.policy import placement
    from spotguard.policy.views import PodView

    rs = built(deployment())
    template = rs["spec"]["template"]
    raw = {
        "metadata": {
            **copy.deepcopy(template["metadata"]),
            "namespace": "shop",
            "generateName": "spotguard-surge-web-",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "spotguard-surge-web", "uid": "u", "controller": True}],
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    view = PodView.from_json(raw)
    assert placement.skip_reason(view, CFG) == "the pod's spec already pins a capacity type"
    assert surgecopy.workload_of_copy_pod(view) == "Deployment/shop/web"
    # A copy of spot slots (an autoscaler's drain): left to its template too.
    spot = surgecopy.build(deployment(), 2, CFG, on_demand=False)
    assert not isinstance(spot, Refusal)
    raw["metadata"]["labels"] = dict(spot["spec"]["template"]["metadata"]["labels"])
    raw["spec"] = copy.deepcopy(spot["spec"]["template"]["spec"])
    reason = placement.skip_reason(PodView.from_json(raw), CFG)
    assert reason == "a pod of spotguard's surge copy (placed by its template)"


@pytest.mark.parametrize("on_demand", [True, False], ids=["on-demand", "spot-slots"])
def test_the_copys_pods_keep_their_nodes_from_the_node_autoscalers(on_demand: bool) -> None:
    """As the replica surge's replicas (admission protects those, and skips the copy's pods):
    Karpenter does not consolidate, the Cluster Autoscaler does not scale down, a node holding
    a copy's pod while the surge needs it. (The demo's rebalance surge: Karpenter consolidated
    an on-demand node with copy pods, and its drain took db below its floor.)"""
    rs = surgecopy.build(deployment(), 2, CFG, on_demand=on_demand)
    assert not isinstance(rs, Refusal), rs
    notes = rs["spec"]["template"]["metadata"]["annotations"]
    assert notes["karpenter.sh/do-not-disrupt"] == "true"
    assert notes["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert notes["a"] == "b" and notes[SURGE_REPLICA] == "true"
    # a template that says otherwise keeps its own value
    mine = deployment()
    mine["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] = "false"
    rs = surgecopy.build(mine, 2, CFG, on_demand=on_demand)
    assert not isinstance(rs, Refusal), rs
    assert rs["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "false"


def test_a_copys_update_is_a_merge_patch_guarded_by_its_resource_version() -> None:
    """The record and the size in one merge patch carrying the copy's resourceVersion (a 409
    where anyone wrote the copy since); a copy of spot slots switched to on-demand gets the
    on-demand template, every key of the spot slot's it lacks set to null (RFC 7386)."""
    record = SurgeRecord(replicas=3, surge=2, events=("e1", "e2"), nodes=("n1", "n2"), started=1.0, copy=True)
    spot_copy = surgecopy.build(deployment(), 1, CFG, on_demand=False, record=record)
    assert isinstance(spot_copy, dict) and surgecopy.spot_slots(spot_copy)
    spot_copy["metadata"]["resourceVersion"] = "41"
    patch = surgecopy.update_patch(spot_copy, 2, record)
    assert patch["metadata"]["resourceVersion"] == "41" and patch["spec"] == {"replicas": 2}
    assert surgecopy.record_of(patch) == record
    on_demand = surgecopy.build(deployment(), 2, CFG, record=record)
    assert isinstance(on_demand, dict)
    switched = surgecopy.update_patch(spot_copy, 2, record, on_demand_template=on_demand["spec"]["template"])
    applied = patching.merge(spot_copy, switched)  # as the API server applies it
    assert applied["spec"]["template"] == on_demand["spec"]["template"]
    assert not surgecopy.spot_slots(applied) and applied["spec"]["replicas"] == 2

