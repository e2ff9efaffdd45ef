"""The eviction guard's pure decision (spotguard.policy.evictions)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from spotguard.policy import drains, evictions, surges
from spotguard.policy.notices import NodeNotice, NoticeKind
from spotguard.policy.views import Owner, PodView
from spotguard.policy.workloads import SURGE, Kind, Workload

NOW = 1_800_000_000.0
NOTICE = NodeNotice("itn-1", NoticeKind.INTERRUPTION, NOW - 5, NOW + 115)


def pod(name: str, node: str, *, ready: bool = True, terminating: bool = False) -> PodView:
    return PodView("shop", name, owner=Owner("ReplicaSet", "web-1"), node_name=node, phase="Running",
                   ready=ready, terminating=terminating)


def deployment(replicas: int, record: dict | None = None) -> Workload:
    annotations = {SURGE: json.dumps(record)} if record else {}
    return Workload(Kind.DEPLOYMENT, "shop", "web", replicas, annotations)


def nodes(*, doomed: evictions.NodeFacts | None = None) -> dict[str, evictions.NodeFacts]:
    out = {
        "od-1": evictions.NodeFacts("od-1", spot=False),
        "spot-1": doomed or evictions.NodeFacts("spot-1", spot=True, unschedulable=True, notice=NOTICE),
        "spot-2": evictions.NodeFacts("spot-2", spot=True),
    }
    return out


def decide(workload: Workload | None, target: PodView, pods: list[PodView], **kw) -> evictions.Decision:
    args = {"floor_on_demand": 1, "nodes": nodes(), "now": NOW, "first_seen": NOW}
    args.update(kw)
    return evictions.decide(pod=target, workload=workload, pods=pods, **args)


def web(on_demand_ready: int, doomed: int = 4) -> list[PodView]:
    return [pod(f"od-{i}", "od-1") for i in range(on_demand_ready)] + [pod(f"s-{i}", "spot-1") for i in range(doomed)]


def test_a_doomed_pod_waits_until_the_pre_notice_count_is_ready_on_nodes_that_stay() -> None:
    pods = web(2)
    d = decide(deployment(6), pods[-1], pods)
    assert not d.allowed and d.reason == "protected"
    assert "2 Ready pods on nodes that stay" in d.message and "keeps 6" in d.message
    assert "Retry after 5s" in d.message and d.retry_after == 5
    pods = web(6)
    assert decide(deployment(6), pods[-1], pods).allowed


def test_the_surge_record_gives_the_pre_notice_count() -> None:
    record = {"replicas": 6, "surge": 4, "events": ["itn-1"], "nodes": ["spot-1"], "started": NOW, "ready": 5}
    pods = web(5)
    assert decide(deployment(10, record), pods[-1], pods).allowed  # 5 were Ready before the notice
    pods = web(4)
    assert not decide(deployment(10, record), pods[-1], pods).allowed
    # the owner scaled to 3 during the surge: 3 is what it wants now
    lowered = {**record, "written": 10}
    pods = web(3)
    assert decide(deployment(3, lowered), pods[-1], pods).allowed


def test_ready_pods_on_other_nodes_going_away_do_not_count() -> None:
    pods = [pod(f"o{i}", "od-1") for i in range(3)] + [pod(f"x{i}", "spot-3") for i in range(3)] + [pod("s", "spot-1")]
    disrupted = frozenset({"karpenter.sh/disrupted"})
    facts = {**nodes(), "spot-3": evictions.NodeFacts("spot-3", spot=True, taint_keys=disrupted)}
    assert not decide(deployment(6), pods[-1], pods, nodes=facts).allowed
    facts["spot-3"] = evictions.NodeFacts("spot-3", spot=True)
    assert decide(deployment(6), pods[-1], pods, nodes=facts).allowed


@pytest.mark.parametrize("taint", sorted(evictions.GOING_AWAY_TAINTS))
def test_every_drainer_taint_marks_a_node_going_away(taint: str) -> None:
    assert evictions.NodeFacts("n", spot=True, taint_keys=frozenset({taint})).going_away
    assert not evictions.NodeFacts("n", spot=True, taint_keys=frozenset({"example.com/other"})).going_away


def test_allowed_without_protection_to_give() -> None:
    pods = web(0)
    target = pods[-1]
    assert decide(None, target, pods).reason == "not-managed"
    assert decide(deployment(6), pod("s", "spot-1", ready=False), pods).reason == "not-serving"
    assert decide(deployment(6), pod("s", "spot-1", terminating=True), pods).reason == "not-serving"
    assert decide(deployment(6), pod("s", "spot-2"), pods).reason == "node-stays"  # not cordoned
    on_demand = evictions.NodeFacts("spot-1", spot=False, unschedulable=True)
    assert decide(deployment(6), target, pods, nodes=nodes(doomed=on_demand)).reason == "not-spot"


def test_bounded_by_the_reclaim_time() -> None:
    pods = web(0)
    timing = evictions.Timing(grace=8, release=30)
    release_at = NOTICE.until - 30
    assert not decide(deployment(6), pods[-1], pods, now=release_at - 1, timing=timing).allowed
    late = decide(deployment(6), pods[-1], pods, now=release_at - 1, timing=timing)
    assert late.retry_after == 1
    assert decide(deployment(6), pods[-1], pods, now=release_at, timing=timing).reason == "reclaim-near"


def test_without_a_notice_a_going_away_spot_node_is_protected_for_the_grace_only() -> None:
    pods = web(0)
    cordoned = evictions.NodeFacts("spot-1", spot=True, unschedulable=True)
    timing = evictions.Timing(grace=8, release=30)
    facts = nodes(doomed=cordoned)
    denied = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 7.5, first_seen=NOW, timing=timing)
    assert not denied.allowed and denied.retry_after == 1 and "notice for it may be on its way" in denied.message
    allowed = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 8, first_seen=NOW, timing=timing)
    assert allowed.reason == "no-notice"


def test_the_grace_without_a_notice_runs_out_as_of_the_nodes_read_not_the_decision() -> None:
    """A review held by slow reads decides seconds after it read the pod's node: that the node
    had no notice is known as of the read only (chaos aborted-drain under timeouts: read at
    the drain's start, spotguard's mark at +8.5 s, the review let the pod go at +12.6 s as
    "no-notice")."""
    pods = web(0)
    facts = nodes(doomed=evictions.NodeFacts("spot-1", spot=True, unschedulable=True))
    timing = evictions.Timing(grace=8, release=30)
    held = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 12, first_seen=NOW, timing=timing,
                  node_read_at=NOW + 6)
    assert not held.allowed and held.reason == "protected" and held.retry_after == 1
    read_late = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 12, first_seen=NOW, timing=timing,
                       node_read_at=NOW + 8)
    assert read_late.reason == "no-notice"


def test_failures_in_a_row_are_one_drains_retries() -> None:
    """A pod's failed reviews count from the first of a run; a failure more than the error
    hold after the last one (an aborted drain's, a minute before) begins a new run."""
    timing = evictions.Timing(error_hold=20)
    assert evictions.errors_began(None, 100.0, timing) == 100.0
    assert evictions.errors_began((100.0, 110.0), 125.0, timing) == 100.0  # the drainer's retries
    assert evictions.errors_began((100.0, 110.0), 206.0, timing) == 206.0  # a new drain
    assert evictions.on_error(error="x", first_error=100.0, now=125.0, timing=timing).reason == "failed-open"
    assert not evictions.on_error(error="x", first_error=206.0, now=206.0, timing=timing).allowed


def test_a_node_the_surge_record_names_is_guarded_to_its_reclaim_time_without_its_mark() -> None:
    """The node's taint and mark failed (a 500 on each try; the notice comes back only at its
    redelivery, 40 s later at x20), but the workload's surge names the node: guarded as a
    noticed node, not for the grace only (found by tests/chaos drainer-at-notice under 500s:
    api 3 -> 2 when the grace let the drainer take a pod while the surge was starting)."""
    pods = web(0)
    cordoned = evictions.NodeFacts("spot-1", spot=True, unschedulable=True)
    facts = nodes(doomed=cordoned)
    timing = evictions.Timing(grace=8, release=30)
    record = {"replicas": 6, "surge": 4, "events": ["itn-1"], "nodes": ["spot-1"], "started": NOW,
              "until": {"spot-1": NOW + 120}}
    surged = deployment(10, record)
    held = decide(surged, pods[-1], pods, nodes=facts, now=NOW + 60, first_seen=NOW, timing=timing)
    assert not held.allowed and held.reason == "protected" and "surge covers it" in held.message
    assert decide(surged, pods[-1], pods, nodes=facts, now=NOW + 90, first_seen=NOW, timing=timing).reason == (
        "reclaim-near")
    # a node the surge does not name keeps the grace only
    other = {**record, "nodes": ["spot-9"], "until": {"spot-9": NOW + 120}}
    assert decide(deployment(10, other), pods[-1], pods, nodes=facts, now=NOW + 60, first_seen=NOW,
                  timing=timing).reason == "no-notice"
    # a rebalance recommendation's node: held for the rebalance hold at most
    rebalance = {**record, "rebalance": ["spot-1"], "until": {"spot-1": NOW + 900}}
    timing = evictions.Timing(grace=8, release=30, rebalance_hold=120)
    assert not decide(deployment(10, rebalance), pods[-1], pods, nodes=facts, now=NOW + 119, first_seen=NOW,
                      timing=timing).allowed
    assert decide(deployment(10, rebalance), pods[-1], pods, nodes=facts, now=NOW + 120, first_seen=NOW,
                  timing=timing).reason == "rebalance-over"
    # a finished surge says nothing any more
    done = {**record, "surge": 0, "done": True}
    assert decide(deployment(6, done), pods[-1], pods, nodes=facts, now=NOW + 60, first_seen=NOW,
                  timing=timing).reason == "no-notice"


def test_a_statefulset_keeps_its_floor_only() -> None:
    sts = Workload(Kind.STATEFULSET, "shop", "db", 3)
    pods = [PodView("shop", f"db-{i}", owner=Owner("StatefulSet", "db"), node_name=n, phase="Running", ready=True)
            for i, n in enumerate(["od-1", "od-1", "spot-1"])]
    assert decide(sts, pods[2], pods, floor_on_demand=2).allowed
    assert not decide(sts, pods[2], pods[1:], floor_on_demand=2).allowed


def test_a_rebalance_recommendation_holds_a_drain_for_a_bounded_time_only() -> None:
    pods = web(0)
    rebalance = NodeNotice("rbl-1", NoticeKind.REBALANCE, NOW, NOW + 900)
    facts = nodes(doomed=evictions.NodeFacts("spot-1", spot=True, unschedulable=True, notice=rebalance))
    timing = evictions.Timing(rebalance_hold=120)
    assert not decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 119, timing=timing).allowed
    assert decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 120, timing=timing).reason == "rebalance-over"


def test_an_api_error_asks_for_a_retry_until_the_error_hold_then_allows() -> None:
    timing = evictions.Timing(error_hold=20.0)
    refused = evictions.on_error(error="Transient: 500", first_error=100.0, now=100.0, timing=timing)
    assert not refused.allowed and refused.retry_after == evictions.ERROR_RETRY_SECONDS
    assert refused.reason == "api-error" and "Transient: 500" in refused.message
    assert not evictions.on_error(error="x", first_error=100.0, now=119.9, timing=timing).allowed
    assert evictions.on_error(error="x", first_error=100.0, now=120.0, timing=timing) == evictions.Decision(
        True, "failed-open"
    )


def test_a_drain_after_a_rebalance_recommendations_hold_gets_the_grace_then_the_warnings_reclaim_time() -> None:
    """Issue 27, 1: the recommendation (action taint) marked the node until t+600; the
    interruption warning comes 130 s later and a drainer cordons and evicts before spotguard
    has handled it. The hold is over, but the cordon is a new drain signal: the grace from
    its first sighting, then the warning's reclaim time once spotguard has written it."""
    pods = web(0)
    rebalance = NodeNotice("rbl-1", NoticeKind.REBALANCE, NOW, NOW + 600)
    timing = evictions.Timing(grace=8, release=30, rebalance_hold=120)
    marked = evictions.NodeFacts("spot-1", spot=True, taint_keys=frozenset({evictions.INTERRUPTION_TAINT}),
                                 notice=rebalance)
    assert marked.going_away and not marked.drain_signals  # spotguard's own mark only
    assert decide(deployment(6), pods[-1], pods, nodes=nodes(doomed=marked), now=NOW + 130,
                  timing=timing).reason == "rebalance-over"
    cordoned = dataclasses.replace(marked, unschedulable=True)
    assert cordoned.drain_signals == {evictions.UNSCHEDULABLE}
    held = decide(deployment(6), pods[-1], pods, nodes=nodes(doomed=cordoned), now=NOW + 131, first_seen=NOW + 130,
                  timing=timing)
    assert not held.allowed and held.reason == "protected" and "rebalance recommendation" in held.message
    assert decide(deployment(6), pods[-1], pods, nodes=nodes(doomed=cordoned), now=NOW + 138, first_seen=NOW + 130,
                  timing=timing).reason == "rebalance-over"
    # the warning's mark: its reclaim time
    warned = dataclasses.replace(cordoned, notice=NodeNotice("itn-1", NoticeKind.INTERRUPTION, NOW + 130, NOW + 250))
    assert not decide(deployment(6), pods[-1], pods, nodes=nodes(doomed=warned), now=NOW + 200, first_seen=NOW + 130,
                      timing=timing).allowed
    # the mark still says rebalance (its write failed) but the surge record has the reclaim time
    record = {"replicas": 6, "surge": 4, "events": ["itn-1"], "nodes": ["spot-1"], "started": NOW + 130,
              "until": {"spot-1": NOW + 250}}
    assert not decide(deployment(10, record), pods[-1], pods, nodes=nodes(doomed=cordoned), now=NOW + 200,
                      first_seen=NOW + 130, timing=timing).allowed


def test_the_pod_and_its_node_decide_first() -> None:
    staying = evictions.NodeFacts("spot-2", spot=True)
    assert evictions.at_node(pod=pod("s", "spot-2"), node=staying) == evictions.Decision(True, "node-stays")
    assert evictions.at_node(pod=pod("s", "gone"), node=None) == evictions.Decision(True, "node-stays")
    assert evictions.at_node(pod=pod("s", "spot-1", ready=False), node=None).reason == "not-serving"
    cordoned = evictions.NodeFacts("spot-1", spot=True, unschedulable=True)
    assert evictions.at_node(pod=pod("s", "spot-1"), node=cordoned) is None
    # the workload unread: an on-demand node without a notice is never guarded; a spot node is unknown
    assert evictions.without_workload(node=cordoned) is None
    assert evictions.without_workload(node=dataclasses.replace(cordoned, spot=False)) == evictions.Decision(
        True, "not-spot")
    assert evictions.without_workload(node=dataclasses.replace(cordoned, spot=False, notice=NOTICE)) is None
    # an on-demand node a node autoscaler drains holds a Deployment's pods before spotguard's
    # notice is written: unknown too (a failed read let Karpenter's consolidation take one)
    for taint in sorted(drains.AUTOSCALER_DRAIN_TAINTS):
        drained = evictions.NodeFacts("od-2", spot=False, taint_keys=frozenset({taint}))
        assert evictions.without_workload(node=drained) is None, taint


def statefulset(replicas: int) -> Workload:
    return Workload(Kind.STATEFULSET, "data", "db", replicas, {})


def test_a_statefulset_floor_holds_against_a_drained_on_demand_node() -> None:
    # GIVEN db (10, floor 6): 6 on on-demand, 4 on spot nodes reclaimed a moment ago (their
    # pods still look Ready: the node controller has not marked the nodes yet, so the
    # budget allows one disruption) WHEN Karpenter consolidates od-2, one of the floor nodes
    consolidated = evictions.NodeFacts("od-2", spot=False, taint_keys=frozenset({"karpenter.sh/disrupted"}))
    facts = {**nodes(), "od-2": consolidated}
    pods = ([pod(f"db-{i}", "od-1") for i in range(5)] + [pod("db-5", "od-2")]
            + [pod(f"db-{i}", "spot-1") for i in range(6, 10)])
    timing = evictions.Timing(floor_hold=300)
    d = decide(statefulset(10), pods[5], pods, floor_on_demand=6, nodes=facts, timing=timing)
    # THEN the floor pod stays (5 on nodes that stay, 6 kept), the drainer retrying
    assert not d.allowed and d.reason == "protected"
    assert "od-2 is being drained" in d.message and "keeps 6" in d.message
    # AND not past the hold: a drain is never wedged
    late = decide(statefulset(10), pods[5], pods, floor_on_demand=6, nodes=facts, timing=timing,
                  now=NOW + 300, first_seen=NOW)
    assert late.allowed and late.reason == "floor-hold-over"
    # AND above its floor the StatefulSet's pod goes at once
    more = [*pods, pod("db-extra", "od-1")]
    assert decide(statefulset(10), pods[5], more, floor_on_demand=6, nodes=facts, timing=timing).allowed


def test_a_statefulset_with_every_pod_serving_is_drained_at_once_even_at_its_floor() -> None:
    # GIVEN db (2, floor 2: its quorum) serving on od-1 and od-2, nothing missing WHEN od-2
    # is drained: its pod cannot be replaced before it goes, so holding the drain would only
    # delay it: it goes at once
    consolidated = evictions.NodeFacts("od-2", spot=False, taint_keys=frozenset({"karpenter.sh/disrupted"}))
    facts = {**nodes(), "od-2": consolidated}
    pods = [pod("db-0", "od-1"), pod("db-1", "od-2")]
    assert decide(statefulset(2), pods[1], pods, floor_on_demand=2, nodes=facts).reason == "not-spot"
    # one of its pods lost elsewhere (its node reclaimed; the pod Pending again): held
    short = [pod("db-0", "od-1"), pod("db-1", "od-2"), pod("db-2", "", ready=False)]
    assert not decide(statefulset(3), short[1], short, floor_on_demand=2, nodes=facts).allowed


def test_a_deployment_is_guarded_off_spot_only_while_its_surge_runs_or_an_autoscaler_drains() -> None:
    cordoned = evictions.NodeFacts("od-2", spot=False, unschedulable=True)
    facts = {**nodes(), "od-2": cordoned}
    pods = [pod(f"o-{i}", "od-1") for i in range(3)] + [pod(f"n-{i}", "od-2") for i in range(3)]
    running = {"replicas": 6, "surge": 4, "events": ["itn-1"], "nodes": ["spot-1"], "started": NOW, "ready": 6}
    # its surge runs: the count before the notice is kept on every node
    d = decide(deployment(10, running), pods[-1], pods, nodes=facts)
    assert not d.allowed and "surge for a spot notice is still running" in d.message
    # no surge, or a finished one, on a node a person drains: the user's budget's business
    assert decide(deployment(6), pods[-1], pods, nodes=facts).reason == "not-spot"
    finished = {**running, "surge": 0, "done": True}
    assert decide(deployment(6, finished), pods[-1], pods, nodes=facts).reason == "not-spot"


@pytest.mark.parametrize("taint", sorted(drains.AUTOSCALER_DRAIN_TAINTS))
def test_a_deployment_on_a_node_an_autoscaler_drains_waits_for_its_replacements(taint: str) -> None:
    # GIVEN web (6): 3 on od-1, 3 on od-2, which Karpenter consolidates / the Cluster
    # Autoscaler scales down (their drain taint), no surge yet
    drained = evictions.NodeFacts("od-2", spot=False, taint_keys=frozenset({taint}))
    facts = {**nodes(), "od-2": drained}
    pods = [pod(f"o-{i}", "od-1") for i in range(3)] + [pod(f"n-{i}", "od-2") for i in range(3)]
    timing = evictions.Timing(floor_hold=300)
    # THEN its pods there wait for spotguard's reconcile to surge them (3 on nodes that stay, 6 kept)
    d = decide(deployment(6), pods[-1], pods, nodes=facts, timing=timing)
    assert not d.allowed and d.reason == "protected"
    assert "a node autoscaler drains it" in d.message and "keeps 6" in d.message
    # AND go once the replacements are Ready elsewhere
    replaced = [*pods, *(pod(f"r-{i}", "od-1") for i in range(3))]
    assert decide(deployment(6), pods[-1], replaced, nodes=facts, timing=timing).reason == "replaced"
    # AND never past the hold: the drain is not wedged when no surge comes
    late = decide(deployment(6), pods[-1], pods, nodes=facts, timing=timing, now=NOW + 300, first_seen=NOW)
    assert late.allowed and late.reason == "floor-hold-over"
    # AND once the node carries the drain's notice, its end bounds the hold (30 s before it)
    mark = NodeNotice("drain/od-2/1", NoticeKind.DRAIN, NOW, NOW + 300)
    facts["od-2"] = dataclasses.replace(drained, notice=mark)
    assert not decide(deployment(6), pods[-1], pods, nodes=facts, timing=timing, now=NOW + 269).allowed
    assert decide(deployment(6), pods[-1], pods, nodes=facts, timing=timing, now=NOW + 270).reason == "reclaim-near"


def statefulset_pod(name: str, node: str) -> PodView:
    return PodView("shop", name, owner=Owner("StatefulSet", "web"), node_name=node, phase="Running", ready=True)


@pytest.mark.parametrize("taint", sorted(drains.AUTOSCALER_DRAIN_TAINTS))
def test_a_deployment_on_a_spot_node_an_autoscaler_drains_without_a_notice_is_held_past_the_grace(taint: str) -> None:
    """Karpenter consolidates spot nodes too (after a return to spot it packed the new spot
    nodes and the demo lost 2 of api's 3 replicas for 32 s: the guard let them go 8 s after
    the taint, as for a reclaim whose warning is on its way). A Deployment's pods there wait
    for their replacements as on an on-demand node, for the floor hold at most."""
    drained = evictions.NodeFacts("spot-1", spot=True, taint_keys=frozenset({taint}))
    facts = nodes(doomed=drained)
    pods = web(2)
    timing = evictions.Timing(grace=8, floor_hold=300)
    held = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 60, first_seen=NOW, timing=timing)
    assert not held.allowed and held.reason == "protected" and "a node autoscaler drains it" in held.message
    late = decide(deployment(6), pods[-1], pods, nodes=facts, now=NOW + 300, first_seen=NOW, timing=timing)
    assert late.reason == "floor-hold-over"
    # a StatefulSet's pod there keeps the grace (a reclaim's warning is what holds it longer)
    sts = Workload(Kind.STATEFULSET, "shop", "web", 2, {})
    db = [statefulset_pod("web-0", "od-1"), statefulset_pod("web-1", "spot-1")]
    assert not decide(sts, db[1], db, nodes=facts, now=NOW + 7, first_seen=NOW, timing=timing,
                      floor_on_demand=2).allowed
    assert decide(sts, db[1], db, nodes=facts, now=NOW + 8, first_seen=NOW, timing=timing,
                  floor_on_demand=2).reason == "no-notice"
    # a spot node cordoned by someone else (no autoscaler's taint) keeps the grace for a Deployment
    cordoned = nodes(doomed=evictions.NodeFacts("spot-1", spot=True, unschedulable=True))
    assert decide(deployment(6), pods[-1], pods, nodes=cordoned, now=NOW + 8, first_seen=NOW,
                  timing=timing).reason == "no-notice"


def test_a_drained_nodes_pods_whose_surge_is_ready_wait_for_spotguards_scale_back() -> None:
    """Once a drain's replacements were Ready the guard let Karpenter evict the drained pods;
    the ReplicaSet, still at the surged count, created one more pod for each, and Karpenter
    launched a node for them (removed again once the surge was over). The scale back removes
    the drained pods itself now (spotguard.policy.interruption.finish): the guard holds them
    for it, until the drain's release at the latest."""
    mark = NodeNotice("drain/od-2/1", NoticeKind.DRAIN, NOW, NOW + 300)
    drained = evictions.NodeFacts("od-2", spot=False, taint_keys=frozenset({"karpenter.sh/disrupted"}), notice=mark)
    facts = {**nodes(), "od-2": drained}
    pods = [pod(f"o-{i}", "od-1") for i in range(6)] + [pod(f"n-{i}", "od-2") for i in range(3)]
    running = {"replicas": 6, "surge": 3, "events": ["drain/od-2/1"], "nodes": ["od-2"], "started": NOW, "ready": 6}
    # GIVEN web's surge for the drain, its 6 replicas Ready on od-1
    d = decide(deployment(9, running), pods[-1], pods, nodes=facts, now=NOW + 40)
    assert not d.allowed and d.reason == "scale-back-pending"
    assert "spotguard's scale back removes this pod itself" in d.message and d.retry_after == 5
    # AND never past the drain's release (30 s before its end)
    assert decide(deployment(9, running), pods[-1], pods, nodes=facts, now=NOW + 270).reason == "reclaim-near"
    # AND once the surge is over (the record done) or where a copy surges, the pods may go
    done = {**running, "surge": 0, "done": True}
    assert decide(deployment(6, done), pods[-1], pods, nodes=facts, now=NOW + 40).allowed
    copy = {**running, "copy": True}
    assert decide(deployment(6, copy), pods[-1], pods, nodes=facts, now=NOW + 40).reason == "replaced"
    # AND a reclaimed node's pods go once replaced, as before (its drainer keeps its own pace)
    reclaimed = {**nodes(), "od-2": dataclasses.replace(drained, notice=NOTICE)}
    at_reclaim = {**running, "events": [NOTICE.event_id]}
    assert decide(deployment(9, at_reclaim), pods[-1], pods, nodes=reclaimed, now=NOW + 40).reason == "replaced"


def test_the_record_the_surge_copy_carries_is_the_guards_where_the_deployment_lost_its_own() -> None:
    """A ``kubectl replace`` (or a GitOps replace) of web took its ``spotguard.io/surge``
    annotation, or a copy's surge keeps its record on its copy only: the record the copy
    carries (``surgecopy.RECORD``, read by the adapter) still names spot-1, whose mark was
    never written. The guard holds web's pod there per that record's cover and keeps its
    Ready count; the copy's record wins over the Deployment's annotation, and a finished
    one says nothing (the Deployment's, where it has one, decides)."""
    pods = web(0)
    facts = nodes(doomed=evictions.NodeFacts("spot-1", spot=True, unschedulable=True))
    timing = evictions.Timing(grace=8, release=30)
    covering = {"replicas": 6, "surge": 4, "events": ["itn-1"], "nodes": ["spot-1"], "started": NOW, "ready": 5,
                "written": 6, "until": {"spot-1": NOW + 120}, "copy": True}
    copy_record = surges.SurgeRecord.parse(json.dumps(covering))
    assert copy_record is not None
    at = {"nodes": facts, "now": NOW + 60, "first_seen": NOW, "timing": timing}
    replaced = deployment(6)  # no annotation left
    # GIVEN the replaced Deployment alone: a spot node without a notice, the grace only
    assert decide(replaced, pods[-1], pods, **at).reason == "no-notice"
    # WHEN the copy's record is read too: held to the reclaim time it names, 5 kept serving
    held = decide(replaced, pods[-1], pods, copy_record=copy_record, **at)
    assert not held.allowed and held.reason == "protected", held
    assert "the workload's surge covers it" in held.message and "keeps 5" in held.message
    assert decide(replaced, pods[-1], pods, copy_record=copy_record, **{**at, "now": NOW + 90}).reason == (
        "reclaim-near")
    # AND it wins over an annotation the replace put back (a manifest's old record, another node)
    elsewhere = {**covering, "nodes": ["spot-9"], "until": {"spot-9": NOW + 120}}
    assert not decide(deployment(6, elsewhere), pods[-1], pods, copy_record=copy_record, **at).allowed
    # AND a finished copy record leaves the Deployment's own to decide
    finished = dataclasses.replace(copy_record, surge=0, done=True)
    assert decide(deployment(6, elsewhere), pods[-1], pods, copy_record=finished, **at).reason == "no-notice"
    assert not decide(deployment(6, covering), pods[-1], pods, copy_record=finished, **at).allowed
    # AND off spot (an on-demand node drained, no notice), the copy's running surge guards it
    drained = {**nodes(), "od-2": evictions.NodeFacts("od-2", spot=False, unschedulable=True)}
    off = [pod(f"o-{i}", "od-1") for i in range(3)] + [pod(f"n-{i}", "od-2") for i in range(3)]
    assert decide(replaced, off[-1], off, nodes=drained).reason == "not-spot"
    guarded = decide(replaced, off[-1], off, nodes=drained, copy_record=copy_record)
    assert not guarded.allowed and "surge for a spot notice is still running" in guarded.message
    # AND a StatefulSet has no copy: a record given for it is not read
    sts = Workload(Kind.STATEFULSET, "shop", "web", 2, {})
    assert evictions.record_for(sts, copy_record) is None
