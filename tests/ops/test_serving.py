"""Serving replicas are the truth, not the API's Ready: a pod on a reclaimed node stops serving at once."""

from __future__ import annotations

from typing import Any

from spotguard.ops import report, serving


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def node(name: str, capacity: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"cap": capacity}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]}}  # fmt: skip


def pod(uid: str, node_name: str, ready: bool = True, deleting: bool = False, app: str = "web") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "uid": uid, "name": uid, "namespace": "shop", "labels": {"pod-template-hash": "abc"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{app}-abc", "controller": True}],
    }  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node_name},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}  # fmt: skip


def tracker(clock: Clock) -> serving.Serving:
    t = serving.Serving(clock, lambda labels: labels["cap"])
    for n in (node("od-1", "on-demand"), node("spot-1", "spot"), node("spot-2", "spot")):
        t.on_change("ADDED", "nodes", n)
    return t


KEY = "Deployment/shop/web"


def test_a_reclaimed_node_stops_its_pods_serving_though_the_api_still_says_ready() -> None:
    clock = Clock()
    t = tracker(clock)
    for uid, where in (("a", "od-1"), ("b", "spot-1"), ("c", "spot-1"), ("d", "spot-2")):
        t.on_change("ADDED", "pods", pod(uid, where))
    assert t.snapshot()[KEY].serving == {"spot": 3, "on-demand": 1}
    t.arm({KEY: 4})
    t.will_die(["spot-1"], clock.t + 120)
    clock.t += 119
    t.tick()
    assert t.snapshot()[KEY].total == 4
    # WHEN the reclaim time comes, with no API change at all
    clock.t += 1
    t.tick()
    # THEN its two pods stop serving at once
    c = t.snapshot()[KEY]
    assert c.total == 2 and c.lowest == 2 and c.before == 4
    # AND a replacement on on-demand counts once Ready, and the time below desired is measured
    t.on_change("ADDED", "pods", pod("e", "od-1", ready=False))
    clock.t += 30
    t.on_change("MODIFIED", "pods", pod("e", "od-1"))
    t.on_change("ADDED", "pods", pod("f", "od-1"))
    t.settle()
    c = t.snapshot()[KEY]
    assert c.total == 4 and c.lowest == 2
    assert 29.9 <= c.below_seconds <= 30.1


def test_not_ready_nodes_and_terminating_pods_do_not_serve() -> None:
    clock = Clock()
    t = tracker(clock)
    t.on_change("ADDED", "pods", pod("a", "spot-2"))
    t.on_change("ADDED", "pods", pod("b", "od-1"))
    t.arm({KEY: 2})
    t.on_change("MODIFIED", "pods", pod("b", "od-1", deleting=True))  # evicted: out of the endpoints at once
    assert t.snapshot()[KEY].total == 1
    t.on_change("MODIFIED", "nodes", node("spot-2", "spot", ready=False))
    assert t.snapshot()[KEY].total == 0 and t.snapshot()[KEY].lowest == 0
    # a pod on a node not seen yet counts once the node is known
    t.on_change("ADDED", "pods", pod("c", "spot-9"))
    assert t.snapshot()[KEY].total == 0
    t.on_change("ADDED", "nodes", node("spot-9", "spot"))
    assert t.snapshot()[KEY].serving["spot"] == 1


def test_totals_over_time_sum_the_workloads() -> None:
    per = {"a": [(0.0, 1, 2), (5.0, 0, 2), (7.0, 1, 1)], "b": [(0.0, 3, 0), (6.0, 0, 3)]}
    assert report._totals([0.0, 5.0, 6.0, 7.0, 10.0], per) == ([4, 3, 0, 1, 1], [2, 2, 5, 4, 4])


def unschedulable(obj: dict[str, Any]) -> dict[str, Any]:
    obj["status"]["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    return obj


def test_the_schedulers_lag_is_measured_from_creation_to_binding_since_the_notice() -> None:
    clock = Clock()
    t = tracker(clock)
    t.on_change("ADDED", "pods", pod("early", "", ready=False))  # before the notice: not measured
    t.arm({KEY: 4})
    assert t.bind_lag() == (0, 0.0, 0.0)
    for uid in ("a", "b", "c"):
        t.on_change("ADDED", "pods", pod(uid, "", ready=False))
    t.on_change("ADDED", "pods", pod("bound-at-once", "od-1", ready=False))  # created bound: no wait
    clock.t += 2
    t.on_change("MODIFIED", "pods", pod("a", "od-1", ready=False))
    t.on_change("MODIFIED", "pods", pod("early", "od-1", ready=False))
    t.on_change("MODIFIED", "pods", unschedulable(pod("c", "", ready=False)))  # no room: not the scheduler's lag
    clock.t += 28
    t.on_change("MODIFIED", "pods", pod("b", "od-1", ready=False))
    t.on_change("MODIFIED", "pods", pod("c", "od-1", ready=False))
    assert t.bind_lag() == (2, 30.0, 30.0)
    assert t.bind_lag(start=1) == (1, 30.0, 30.0)
    t.on_change("ADDED", "pods", pod("gone", "", ready=False))
    t.on_change("DELETED", "pods", pod("gone", "", ready=False))
    clock.t += 100
    assert t.bind_lag()[0] == 2  # a pod deleted unbound was never bound: no wait recorded


def test_a_workload_is_covered_once_its_count_serves_on_nodes_that_stay() -> None:
    """The margin's measure: at the notice web serves 4, two of them on spot-1 (going at +120 s);
    it is covered when 4 serve on nodes that stay, counting the replacements' readiness, never
    the doomed pods, and never before the notice says which nodes go."""
    clock = Clock()
    t = tracker(clock)
    for uid, where in (("a", "od-1"), ("b", "spot-1"), ("c", "spot-1"), ("d", "spot-2")):
        t.on_change("ADDED", "pods", pod(uid, where))
    t.on_change("ADDED", "pods", pod("other", "spot-2", app="api"))
    t.arm({KEY: 4, "Deployment/shop/api": 1})
    t.will_die(["spot-1"], clock.t + 120)
    notice = clock.t
    assert t.snapshot()[KEY].safe == 2 and t.snapshot()[KEY].covered is None
    assert t.snapshot()["Deployment/shop/api"].covered == notice  # nothing on spot-1: covered at once
    # the surge: one replacement Ready at +20 s, a second created at +30 s, Ready at +50 s
    clock.t += 20
    t.on_change("ADDED", "pods", pod("e", "od-1"))
    clock.t += 10
    t.on_change("ADDED", "pods", pod("f", "od-1", ready=False))
    assert t.snapshot()[KEY].covered is None  # 3 on nodes that stay, the 4th not Ready
    clock.t += 20
    t.on_change("MODIFIED", "pods", pod("f", "od-1"))
    assert t.snapshot()[KEY].covered == notice + 50
    # the reclaim takes spot-1's pods: covered stays when it was
    clock.t += 70
    t.tick()
    c = t.snapshot()[KEY]
    assert c.total == 4 and c.safe == 4 and c.covered == notice + 50


def test_evictions_from_nodes_that_stay_are_counted_after_the_notice() -> None:
    # GIVEN web serving on od-1 (a, b) and spot-1 (c), armed at the notice for spot-1
    clock = Clock()
    t = tracker(clock)
    for uid, where in (("a", "od-1"), ("b", "od-1"), ("c", "spot-1")):
        t.on_change("ADDED", "pods", pod(uid, where))
    t.arm({KEY: 3})
    t.will_die(["spot-1"], clock.t + 120)

    def evicted(uid: str, where: str) -> dict[str, Any]:
        p = pod(uid, where, deleting=True)
        p["status"]["conditions"].append(
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
        return p

    # WHEN the Eviction API takes c (on the doomed node: the drainer at the notice) and a (on
    # a node that stays: a consolidation), and b is deleted some other way
    t.on_change("MODIFIED", "pods", evicted("c", "spot-1"))
    t.on_change("MODIFIED", "pods", evicted("a", "od-1"))
    t.on_change("MODIFIED", "pods", pod("b", "od-1", deleting=True))
    # THEN only a counts: a serving pod on a node that stays, taken by the Eviction API
    assert t.snapshot()[KEY].evicted == 1
