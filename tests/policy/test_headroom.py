"""The headroom's size: the placeholders that hold on-demand room for the surge of the workloads at risk."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from spotguard.policy import floors, headroom
from spotguard.policy.config import Config
from spotguard.policy.headroom import Cover, Headroom
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import ENABLED, Kind, Workload

from tests.policy.builders import node, pod

MIB = 2**20
GIB = 2**30
NODES = [node("spot-a", "spot"), node("spot-b", "spot"), node("od-1", "on-demand")]


def workload(
    name: str,
    pods: Sequence[PodView],
    *,
    kind: Kind = Kind.DEPLOYMENT,
    namespace: str = "shop",
    annotations: Mapping[str, str] | None = None,
    cfg: Config | None = None,
) -> WorkloadState:
    wl = Workload(kind, namespace, name, len(pods), dict(annotations or {}))
    return WorkloadState(wl, floors.floor_for(wl, cfg or Config()), tuple(pods))


def pods(
    app: str, where: Sequence[str], cpu: str | None = "500m", memory: str | None = "256Mi", **kw: Any
) -> list[PodView]:
    return [pod(f"{app}-{i}", node_name=n, cpu=cpu, memory=memory, **kw) for i, n in enumerate(where)]


def wanted(cover: Cover, states: Sequence[WorkloadState], nodes: Sequence[NodeView] = NODES, **cfg: Any) -> Headroom:
    return headroom.wanted(Config(headroom=cover, **cfg), nodes, states)


def test_off_wants_nothing_whatever_is_at_risk() -> None:
    states = [workload("web", pods("web", ["spot-a", "spot-b"]))]
    got = wanted(Cover.OFF, states)
    assert got == Headroom(Cover.OFF) and got.count == 0 and got.describe() == "headroom off"


def test_largest_node_covers_the_spot_node_whose_surge_needs_the_most() -> None:
    # GIVEN web (500m/256Mi) with 1 pod on spot-a and 5 on spot-b, api (1 CPU/1Gi) with 1 on spot-a,
    # and an on-demand pod of each (not at risk)
    states = [
        workload("web", pods("web", ["spot-a", *["spot-b"] * 5, "od-1"])),
        workload("api", pods("api", ["spot-a", "od-1"], cpu="1", memory="1Gi")),
    ]
    got = wanted(Cover.LARGEST_NODE, states)
    # THEN each placeholder is as large as the largest pod at risk (1 CPU, 1 GiB) ...
    assert (got.cpu, got.memory) == (1000, GIB)
    # ... and there are enough to hold spot-b's surge (5 x 500m = 2.5 CPU: 3 placeholders), which
    # needs more than spot-a's (1.5 CPU and 1.25 GiB: 2)
    assert got.nodes == ("spot-b",) and got.count == 3 and got.pods == 5
    assert (got.need_cpu, got.need_memory) == (2500, 5 * 256 * MIB)
    assert got.held_cpu >= got.need_cpu and got.held_memory >= got.need_memory
    assert not got.capped
    # on a tie in placeholders, the node needing more CPU, then more memory, is the one covered
    states[0] = workload("web", pods("web", ["spot-a", "spot-b", "spot-b", "spot-b", "od-1"]))
    assert wanted(Cover.LARGEST_NODE, states).nodes == ("spot-a",)  # 1.5 CPU each; 1.25 GiB > 768 MiB


def test_all_spot_covers_every_spot_node_at_once() -> None:
    states = [
        workload("web", pods("web", ["spot-a", "spot-b", "spot-b", "spot-b", "od-1"])),
        workload("api", pods("api", ["spot-a", "od-1"], cpu="1", memory="1Gi")),
    ]
    got = wanted(Cover.ALL_SPOT, states)
    # 4 x 500m + 1 CPU = 3 CPU (3 placeholders of 1 CPU); 4 x 256Mi + 1Gi = 2 GiB (2 of 1 GiB)
    assert got.nodes == ("spot-a", "spot-b") and got.pods == 5
    assert (got.need_cpu, got.need_memory) == (3000, 2 * GIB)
    assert got.count == 3 and (got.cpu, got.memory) == (1000, GIB)


def test_the_count_covers_the_resource_that_needs_more_placeholders() -> None:
    # a memory-heavy pod and a CPU-heavy pod: the placeholder takes the larger of each, and the
    # count is what covers both sums (here memory: 4 GiB + 3 GiB over 4 GiB a placeholder)
    states = [
        workload("cache", pods("cache", ["spot-a"], cpu="100m", memory="4Gi")),
        workload("batch", pods("batch", ["spot-a", "spot-a", "spot-a"], cpu="2", memory="1Gi")),
    ]
    got = wanted(Cover.ALL_SPOT, states)
    assert (got.cpu, got.memory) == (2000, 4 * GIB)
    assert (got.need_cpu, got.need_memory) == (6100, 7 * GIB)
    assert got.count == 4  # ceil(6100 / 2000) = 4 by CPU; ceil(7 / 4) = 2 by memory


def test_nothing_at_risk_wants_no_placeholder() -> None:
    # every replica on on-demand, a StatefulSet on spot (it does not surge), a Deployment opted out,
    # one in an excluded namespace, and pods that no longer count (finished, terminating)
    states = [
        workload("web", pods("web", ["od-1", "od-1"])),
        workload("db", pods("db", ["spot-a", "spot-b"]), kind=Kind.STATEFULSET),
        workload("legacy", pods("legacy", ["spot-a"]), annotations={ENABLED: "false"}),
        workload("agent", pods("agent", ["spot-a"], namespace="kube-system"), namespace="kube-system"),
        workload("done", pods("done", ["spot-a"], phase="Succeeded")),
        workload("going", [dataclasses.replace(pod("going-0", node_name="spot-b"), terminating=True)]),
    ]
    for cover in (Cover.LARGEST_NODE, Cover.ALL_SPOT):
        got = wanted(cover, states)
        assert got.count == 0 and got.pods == 0, got
        assert got.describe() == f"headroom {cover}: nothing at risk"


def test_a_spot_node_under_a_notice_is_no_longer_at_risk() -> None:
    # its surge is written already (the room the placeholders held went to it)
    doomed = node(
        "spot-a", "spot", taints=[{"key": "spotguard.io/interruption", "value": "evt-1", "effect": "NoSchedule"}]
    )
    states = [workload("web", pods("web", ["spot-a", "spot-a", "spot-b"]))]
    got = wanted(Cover.ALL_SPOT, states, nodes=[doomed, NODES[1], NODES[2]])
    assert got.nodes == ("spot-b",) and got.pods == 1 and got.count == 1


def test_capacity_follows_the_configured_label_schemes() -> None:
    # a Karpenter spot node (no node.kubernetes.io/capacity label) is spot too
    karpenter = node("kp-1", None, labels={"karpenter.sh/capacity-type": "spot"})
    states = [workload("web", pods("web", ["kp-1", "kp-1"]))]
    got = wanted(Cover.LARGEST_NODE, states, nodes=[karpenter, NODES[2]])
    assert got.nodes == ("kp-1",) and got.count == 2


@pytest.mark.parametrize(
    ("cpu", "memory", "expected"),
    [
        (None, None, (0, 0)),  # BestEffort: no requests at all
        ("lots", "a few", (0, 0)),  # unreadable quantities are dropped
        ("-2", "256Mi", (0, 256 * MIB)),  # a negative request holds nothing
        ("250m", None, (250, 0)),  # memory absent
    ],
)
def test_absent_or_malformed_requests_hold_no_room(
    cpu: str | None, memory: str | None, expected: tuple[int, int]
) -> None:
    [p] = pods("odd", ["spot-a"], cpu=cpu, memory=memory)
    assert headroom.room(p.requests) == expected


def test_pods_with_no_requests_need_no_placeholder_and_do_not_shrink_the_others() -> None:
    # BestEffort pods fit wherever a pod slot is free: nothing is held for them
    states = [workload("free", pods("free", ["spot-a", "spot-a"], cpu=None, memory=None))]
    got = wanted(Cover.ALL_SPOT, states)
    assert got.count == 0 and got.pods == 2
    # beside a pod with requests, the size is that pod's, the count covers it alone
    states.append(workload("web", pods("web", ["spot-a"], cpu="300m", memory="bad")))
    got = wanted(Cover.ALL_SPOT, states)
    assert (got.cpu, got.memory, got.count) == (300, 0, 1)


def test_the_count_is_capped_by_the_configured_maximum() -> None:
    # 40 pods of 1 CPU on one spot node would want 40 placeholders of 1 CPU
    states = [workload("web", pods("web", ["spot-a"] * 40, cpu="1", memory="1Gi"))]
    got = wanted(Cover.LARGEST_NODE, states, headroom_max_pods=6)
    assert got.wanted == 40 and got.count == 6 and got.capped
    assert "capped at 6 of the 40 wanted" in got.describe()
    # the default maximum holds without configuration; a maximum of 0 holds nothing
    assert wanted(Cover.LARGEST_NODE, states).count == headroom.DEFAULT_MAX_PODS
    assert wanted(Cover.LARGEST_NODE, states, headroom_max_pods=0).count == 0


def test_describe_says_what_is_held_and_for_what() -> None:
    states = [workload("web", pods("web", ["spot-b", "spot-b"]))]
    text = wanted(Cover.LARGEST_NODE, states).describe()
    assert text == (
        "headroom largest-node: 2 placeholder(s) of 500m CPU and 256 MiB for 2 pod(s) at risk "
        "(1000m, 512 MiB) on spot-b"
    )


def placeholder(name: str, *, since: str | None, node_name: str = "", namespace: str = "spotguard",
                reason: str = "Unschedulable", label: bool = True) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "labels": {headroom.LABEL: "true"} if label else {}},
        "spec": {"nodeName": node_name} if node_name else {},
        "status": {},
    }
    if since is not None:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason,
                                        "lastTransitionTime": since}]
    return obj


def test_unplaced_counts_placeholders_unschedulable_for_longer_than_the_bound() -> None:
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    long_ago, lately = "2027-01-15T07:49:00Z", "2027-01-15T07:59:00Z"  # 11 min and 1 min before
    raw = [
        placeholder("a", since=long_ago),
        placeholder("b", since=lately),  # a launch under way
        placeholder("c", since=None, node_name="od-1"),  # running
        placeholder("d", since=long_ago, namespace="shop"),  # not spotguard's namespace
        placeholder("e", since=long_ago, label=False),  # not a placeholder
        placeholder("f", since=long_ago, reason="SchedulingGated"),
    ]
    pods = [PodView.from_json(p, scheduling=False) for p in raw]  # as node-added's snapshot holds them
    assert headroom.unplaced(pods, "spotguard", now) == 1
    assert headroom.unplaced(pods, "spotguard", now, after=30.0) == 2
