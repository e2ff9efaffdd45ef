"""Readiness that flaps (issue 26): a pod whose readiness probe fails now and then goes not
Ready and Ready again while it runs on its node, and a liveness failure restarts its
containers. Before, every simulated pod stayed Ready from its start to its deletion, kinder
than a real cluster: the ReplicaSet ranks a not-Ready pod first for deletion (before
``pod-deletion-cost``), and a pod that is not Ready serves nothing and counts for no budget."""

from __future__ import annotations

from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import objects, pods, testing
from spotguard_sim.controllers import kubelet

from tests.sim import controller_helpers as h

SCALE = 100.0


def _pod(name: str, flaps: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {kubelet.FLAPS: flaps}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
    }


def _ready(pod: dict[str, Any]) -> bool:
    cond = pods.condition(pod, "Ready")
    return cond is not None and cond.get("status") == "True"


def _changed(pod: dict[str, Any]) -> float:
    cond = pods.condition(pod, "Ready")
    assert cond is not None
    return simclock.parse_iso(cond["lastTransitionTime"])


def test_a_flapping_pod_goes_not_ready_and_ready_again_and_restarts() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1"))
        sim.store.create("pods", _pod("p", "every=100,down=30,offset=20,restart=true"))
        get = lambda: sim.store.get("pods", "p", "default")  # noqa: E731
        up = h.wait_for(lambda: get() if _ready(get()) else None, timeout=30, what="ready")
        started = simclock.parse_iso(up["status"]["startTime"])
        down = h.wait_for(lambda: get() if not _ready(get()) else None, timeout=30, what="the first flap")
        assert down["status"]["phase"] == "Running" and down["spec"]["nodeName"] == "n1"
        ready = pods.condition(down, "Ready")
        assert ready is not None and ready["reason"] == "ContainersNotReady"
        assert pods.condition(down, "ContainersReady")["status"] == "False"  # type: ignore[index]
        (cs,) = down["status"]["containerStatuses"]
        assert cs["ready"] is False and cs["restartCount"] == 1 and "terminated" in cs["lastState"]
        assert abs(_changed(down) - (started + 20)) <= 1.0
        again = h.wait_for(lambda: get() if _ready(get()) else None, timeout=30, what="ready again")
        assert abs(_changed(again) - (started + 50)) <= 1.0
        assert again["status"]["containerStatuses"][0]["ready"] is True
        second = h.wait_for(
            lambda: get() if not _ready(get()) else None, timeout=30, what="the second flap"
        )
        assert second["status"]["containerStatuses"][0]["restartCount"] == 2
        assert abs(_changed(second) - (started + 120)) <= 1.0


def test_flaps_without_restart_keep_the_restart_count_and_a_bad_annotation_is_ignored() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1"))
        sim.store.create("pods", _pod("p", "every=60,down=20,offset=5"))
        sim.store.create("pods", _pod("q", "every=20,down=30"))  # down past every: not a schedule
        get = lambda name: sim.store.get("pods", name, "default")  # noqa: E731
        h.wait_for(lambda: _ready(get("q")) or None, timeout=30, what="q ready")
        down = h.wait_for(lambda: get("p") if pods.condition(get("p"), "Ready") and not _ready(get("p")) else None,
                          timeout=30, what="p's flap")
        assert down["status"]["containerStatuses"][0]["restartCount"] == 0
        assert _ready(get("q"))


def test_the_replicaset_deletes_a_flapping_pod_first_whatever_its_deletion_cost() -> None:
    """ActivePodsWithRanks: a not-Ready pod goes before a Ready one, before the deletion cost
    is looked at. spotguard's replica surge marks the pods to remove at its scale-back with a
    low cost; a spot pod that flaps at that moment goes instead."""
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("n1"))
        sim.store.create("replicasets", objects.replicaset("web", 3, namespace="default"))
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 3 or None, timeout=30, what="3 ready")
        names = sorted(p["metadata"]["name"] for p in h.pods_of(sim.store, "web"))
        flapping, *others = names

        def annotate(name: str, notes: dict[str, str]) -> None:
            def edit(p: dict[str, Any]) -> None:
                p["metadata"].setdefault("annotations", {}).update(notes)

            sim.store.mutate("pods", name, "default", edit)

        annotate(flapping, {kubelet.FLAPS: "every=10000,down=9000,offset=0",
                            "controller.kubernetes.io/pod-deletion-cost": "1000"})
        for name in others:
            annotate(name, {"controller.kubernetes.io/pod-deletion-cost": "-10"})
        h.wait_for(lambda: not _ready(sim.store.get("pods", flapping, "default")) or None, timeout=30,
                   what="the flap")

        def scale(rs: dict[str, Any]) -> None:
            rs["spec"]["replicas"] = 2

        sim.store.mutate("replicasets", "web", "default", scale)
        h.wait_for(lambda: len(h.pods_of(sim.store, "web")) == 2 or None, timeout=30, what="scaled to 2")
        assert sorted(p["metadata"]["name"] for p in h.pods_of(sim.store, "web")) == sorted(others)


def test_a_scenarios_workloads_flap_through_their_pod_template() -> None:
    """Scenario-driven: a Generate group's ``podAnnotations`` reach every pod of its Deployments
    (Deployment -> ReplicaSet -> pods), and their readiness flaps out of step (the offset taken
    from each pod's uid)."""
    from spotguard_sim import scenario

    flaps = "every=200,down=100"
    objs = scenario.load([
        {"apiVersion": "sim.spotguard.io/v1", "kind": "Generate", "metadata": {"name": "g"},
         "nodes": [{"count": 2, "namePrefix": "n-", "capacity": "spot"}],
         "workloads": [{"count": 1, "namePrefix": "web-", "replicas": 6,
                        "podAnnotations": {kubelet.FLAPS: flaps}}]},
    ])
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert dep["spec"]["template"]["metadata"]["annotations"] == {kubelet.FLAPS: flaps}
    with testing.running_cluster(objs, time_scale=SCALE) as sim:
        def states() -> list[bool]:
            return [_ready(p) for p in sim.store.list("pods", namespace="default")[0]
                    if p["status"].get("phase") == "Running"]

        seen: set[tuple[int, int]] = set()

        def both_at_once() -> bool | None:
            now = states()
            seen.add((sum(now), len(now)))
            return (len(now) == 6 and 0 < sum(now) < 6) or None  # some Ready, some flapping

        h.wait_for(both_at_once, timeout=30, what=f"some pods flapping while others serve: {sorted(seen)}")
