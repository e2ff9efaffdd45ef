"""A node autoscaler's drain as a notice (spotguard.policy.drains)."""

from __future__ import annotations

from datetime import UTC, datetime

from spotguard.policy import drains, floors, interruption
from spotguard.policy.config import Config
from spotguard.policy.notices import NodeNotice, Notice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE, Kind, Workload

from tests.policy.builders import node, pod

NOW = 1_800_000_000.0
KARPENTER = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]


def notices(nodes, pods, workloads, marks=None, config=None):  # type: ignore[no-untyped-def]
    return drains.notices(
        nodes=nodes,
        pods=pods,
        workloads=workloads,
        marks=marks or {},
        config=config or Config(),
        now=NOW,
        workload_key_of=interruption.workload_key_of,
    )


WEB = Workload(Kind.DEPLOYMENT, "shop", "web", 3, {})
DB = Workload(Kind.STATEFULSET, "shop", "db", 3, {})


def web_pod(name: str, node_name: str, **kw):  # type: ignore[no-untyped-def]
    return pod(name, owner=("ReplicaSet", "web-7d9f"), labels={"app": "web", "pod-template-hash": "7d9f"},
               node_name=node_name, **kw)


def test_an_on_demand_node_an_autoscaler_drains_with_a_managed_deployment_gets_a_drain_notice() -> None:
    drained = node("od-2", "on-demand", taints=KARPENTER)
    out = notices([node("od-1", "on-demand"), drained], [web_pod("web-a", "od-2"), web_pod("web-b", "od-1")], [WEB])
    assert len(out) == 1
    n = out[0]
    assert n.kind is NoticeKind.DRAIN and n.instance_id == drained.instance_id
    assert n.event_id.startswith("drain/od-2/")
    assert n.until is not None and n.until.timestamp() - NOW == drains.DRAIN_WINDOW
    # the plan dooms the node and surges web by its pod there
    plan = interruption.plan(out, nodes=[node("od-1", "on-demand"), drained],
                             pods=[web_pod("web-a", "od-2"), web_pod("web-b", "od-1")], workloads=[WEB],
                             config=Config(), now=NOW)
    assert plan.doomed_nodes == {"od-2"}
    assert [(s.workload.key, s.added) for s in plan.surges] == [("Deployment/shop/web", 1)]
    assert [t.kind for t in plan.taints] == [NoticeKind.DRAIN]


def test_what_is_not_an_autoscalers_drain_of_serving_managed_replicas_gets_none() -> None:
    pods = [web_pod("web-a", "n")]
    # a plain cordon (a person's kubectl drain): its own pace
    assert not notices([node("n", "on-demand", unschedulable=True)], pods, [WEB])
    # no serving pod of a managed Deployment on it: a pod not Ready, a StatefulSet's, an opted-out one's
    drained = [node("n", "on-demand", taints=KARPENTER)]
    assert not notices(drained, [web_pod("web-a", "n", ready=False)], [WEB])
    db = pod("db-0", owner=("StatefulSet", "db"), labels={"app": "db"}, node_name="n")
    assert not notices(drained, [db], [DB])
    off = Workload(Kind.DEPLOYMENT, "shop", "web", 3, {"spotguard.io/enabled": "false"})
    assert not notices(drained, pods, [off])
    # the Cluster Autoscaler's soft taint (a candidate, not a drain) is none either
    soft = [{"key": "DeletionCandidateOfClusterAutoscaler", "effect": "PreferNoSchedule"}]
    assert not notices([node("n", "on-demand", taints=soft)], pods, [WEB])
    # the Cluster Autoscaler's drain is one
    ca = [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
    assert notices([node("n", "on-demand", taints=ca)], pods, [WEB])


def test_a_drain_is_surged_once_and_a_standing_notice_is_left_alone() -> None:
    drained = [node("od-2", "on-demand", taints=KARPENTER)]
    pods = [web_pod("web-a", "od-2")]
    # the drain's own mark, even past its end (the autoscaler still waits for a pod): not again
    old = NodeNotice("drain/od-2/1", NoticeKind.DRAIN, NOW - 900, NOW - 600)
    assert not notices(drained, pods, [WEB], marks={"od-2": old})
    # another notice of spotguard's that stands (a scheduled change): not replaced
    scheduled = NodeNotice("h-1", NoticeKind.SCHEDULED, NOW - 10, NOW + 600)
    assert not notices(drained, pods, [WEB], marks={"od-2": scheduled})
    # one that is over: the drain is a new one
    over = NodeNotice("h-1", NoticeKind.SCHEDULED, NOW - 900, NOW - 600)
    assert notices(drained, pods, [WEB], marks={"od-2": over})
    # a drain's mark stays while the autoscaler drains; once it gave the node up, it goes
    assert drains.mark_kept(old, drained[0])
    assert not drains.mark_kept(old, node("od-2", "on-demand"))
    assert not drains.mark_kept(over, drained[0])


def test_a_node_without_a_provider_id_is_named_by_its_name() -> None:
    raw = node("od-2", "on-demand", taints=KARPENTER)
    bare = type(raw)(**{**raw.__dict__, "provider_id": ""})
    out = notices([bare], [web_pod("web-a", "od-2")], [WEB])
    assert [n.instance_id for n in out] == ["od-2"]
    assert drains.resolved(out, [bare]) == {"od-2": "od-2"}
    assert interruption.match_nodes(out, [bare], drains.resolved(out, [bare])) == {"od-2": "od-2"}


def test_a_spot_node_an_autoscaler_consolidates_gets_a_drain_notice_and_a_warning_after_it_adds_no_surge() -> None:
    """Karpenter deletes an under-used spot node as it does an on-demand one (the demo, after
    the return to spot: api 3 -> 2 and thumbnails 4 -> 2 for 32 s when spot nodes were left
    out). A warning for the same node later (its reclaim) takes the node's mark with its
    sooner reclaim time and surges nothing more: the drain's surge covers its pods."""
    drained = node("spot-2", "spot", taints=KARPENTER)
    nodes = [node("spot-1", "spot"), drained]
    pods = [web_pod("web-a", "spot-2"), web_pod("web-b", "spot-1")]
    out = notices(nodes, pods, [WEB])
    assert [(n.kind, n.instance_id) for n in out] == [(NoticeKind.DRAIN, drained.instance_id)]
    plan = interruption.plan(out, nodes=nodes, pods=pods, workloads=[WEB], config=Config(), now=NOW)
    assert [(s.workload.key, s.added) for s in plan.surges] == [("Deployment/shop/web", 1)]
    step = plan.surges[0]
    mark = plan.taints[0].notice
    assert mark is not None
    # WHEN the reclaim's warning comes for the drained node 20 s later
    surged = Workload(Kind.DEPLOYMENT, "shop", "web", step.replicas, {SURGE: step.record.to_json()})
    tainted = node("spot-2", "spot", taints=[*KARPENTER, {"key": INTERRUPTION_TAINT, "value": mark.event_id,
                                                           "effect": "NoSchedule"}])
    warning = Notice("itn-1", NoticeKind.INTERRUPTION, drained.instance_id, datetime.fromtimestamp(NOW + 20, UTC))
    later = interruption.plan([warning], nodes=[nodes[0], tainted], pods=pods, workloads=[surged], config=Config(),
                              now=NOW + 20, node_notices={"spot-2": mark})
    # THEN the node's mark says the reclaim (two minutes after the warning, sooner than the
    # drain's window) and the surge adds nothing
    reclaim = [(t.kind, t.notice.until if t.notice else None) for t in later.taints]
    assert reclaim == [(NoticeKind.INTERRUPTION, NOW + 20 + 120)]
    assert [s.added for s in later.surges] == [0]
    # AND from the warning on, the drain's replica is an on-demand one (the market takes the node)
    assert later.surges[0].record.spot_drains == ()
    rewarned = Workload(Kind.DEPLOYMENT, "shop", "web", later.surges[0].replicas,
                        {SURGE: later.surges[0].record.to_json()})
    assert floors.floor_for(rewarned, Config()).surge == 1


def test_the_replacements_of_a_spot_node_an_autoscaler_only_drains_are_not_pinned_to_on_demand() -> None:
    """Karpenter consolidates an under-used spot node because its pods fit the room of the
    others. The surge's replicas for them went on-demand: each consolidation of a spot node
    launched on-demand nodes, consolidated in turn once the surge was over, and on
    medium-karpenter the cluster never settled (22 node changes in 961 s after placement,
    $6.63/h against all on-demand's $6.83/h). They now go where web's spot replicas go."""
    drained = node("spot-2", "spot", taints=KARPENTER)
    od = node("od-1", "on-demand", taints=KARPENTER)
    nodes = [node("spot-1", "spot"), drained, od, node("od-2", "on-demand")]
    pods = [web_pod("web-a", "spot-2"), web_pod("web-b", "spot-2"), web_pod("web-c", "od-1"),
            web_pod("web-d", "spot-1")]
    web = Workload(Kind.DEPLOYMENT, "shop", "web", 4, {})
    plan = interruption.plan(notices(nodes, pods, [web]), nodes=nodes, pods=pods, workloads=[web], config=Config(),
                             now=NOW)
    # WHEN both the spot node and an on-demand node are drained: web surges by its three pods there
    step = plan.surges[0]
    assert step.added == 3 and step.record.spot_drains == ("spot-2",)
    surged = Workload(Kind.DEPLOYMENT, "shop", "web", step.replicas, {SURGE: step.record.to_json()})
    floor = floors.floor_for(surged, Config())
    # THEN only the on-demand node's replica is an on-demand surge replica (the floor kept); the
    # spot node's two are spot slots
    assert (floor.surge, floor.on_demand) == (1, 2)
    # AND the record says so through its JSON (what the webhook reads)
    assert SurgeRecord.parse(step.record.to_json()) == step.record
    assert SurgeRecord.parse('{"replicas": 4, "surge": 2, "spotDrains": "spot-2"}') == SurgeRecord(4, 2)


def test_the_replacements_of_a_drained_on_demand_node_are_on_demand_only_as_far_as_the_floor_needs() -> None:
    """Karpenter consolidates an on-demand node holding replicas that wait there for their
    return to spot (the demo with a drainer: thumbnails, floor 0, had 3 on-demand replicas
    after the reclaim). Their replacements were pinned to on-demand: Karpenter launched an
    on-demand node for them, node-added's move of them found no fewer on-demand replicas and
    held the workload 600 s. Only what the floor needs on on-demand stays there now."""
    drained = node("od-2", "on-demand", taints=KARPENTER)
    nodes = [node("od-1", "on-demand"), drained, node("spot-1", "spot")]
    # web: 5 replicas, floor 1 (the default); 1 on od-1, 3 on the drained od-2, 1 on spot
    pods = [web_pod("web-a", "od-1"), web_pod("web-b", "od-2"), web_pod("web-c", "od-2"),
            web_pod("web-d", "od-2"), web_pod("web-e", "spot-1")]
    web = Workload(Kind.DEPLOYMENT, "shop", "web", 5, {})
    plan = interruption.plan(notices(nodes, pods, [web]), nodes=nodes, pods=pods, workloads=[web],
                             config=Config(), now=NOW)
    step = plan.surges[0]
    # WHEN the drained node's three pods are surged
    assert step.added == 3 and step.record.spare_drains == (("od-2", 3),)
    surged = Workload(Kind.DEPLOYMENT, "shop", "web", step.replicas, {SURGE: step.record.to_json()})
    # THEN the floor is kept by od-1's replica: none of the three replacements is on-demand
    assert (floors.floor_for(surged, Config()).surge, floors.floor_for(surged, Config()).on_demand) == (0, 1)
    assert SurgeRecord.parse(step.record.to_json()) == step.record
    # AND where the floor's replica is on the drained node itself, its replacement stays on-demand
    pods[0] = web_pod("web-a", "spot-1")
    plan = interruption.plan(notices(nodes, pods, [web]), nodes=nodes, pods=pods, workloads=[web],
                             config=Config(), now=NOW)
    record = plan.surges[0].record
    assert record.spare_drains == (("od-2", 2),) and record.on_demand_surge == 1
    # AND a notice of the provider's for the node (not a drain) makes every replacement on-demand
    surged = Workload(Kind.DEPLOYMENT, "shop", "web", plan.surges[0].replicas, {SURGE: record.to_json()})
    mark = plan.taints[0].notice
    assert mark is not None
    scheduled = Notice("h-1", NoticeKind.SCHEDULED, drained.instance_id, datetime.fromtimestamp(NOW + 20, UTC),
                       until=datetime.fromtimestamp(NOW + 600, UTC))
    later = interruption.plan([scheduled], nodes=nodes, pods=pods, workloads=[surged], config=Config(), now=NOW + 20,
                              node_notices={"od-2": mark})
    assert later.surges[0].record.spare_drains == () and later.surges[0].record.on_demand_surge == 3
