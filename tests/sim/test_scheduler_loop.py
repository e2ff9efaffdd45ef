"""The scheduling loop in the running simulated cluster: binding, the
Unschedulable condition, and retries when the cluster changes.
https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/ and
https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/ (PodScheduled)"""

from __future__ import annotations

from typing import Any

import kubernetes
from spotguard_sim import testing

from tests.sim import controller_helpers as h

SCALE = 50.0


def scheduled_condition(sim: Any, name: str) -> dict[str, Any] | None:
    pod = sim.store.get("pods", name, "default")
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), None)


def test_unschedulable_pod_waits_and_is_retried_when_a_node_joins() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("small", cpu="1"))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        core.create_namespaced_pod("default", {"metadata": {"name": "big"}, "spec": {
            "containers": [{"name": "c", "image": "nginx:1.27",
                            "resources": {"requests": {"cpu": "2"}}}]}})
        cond = h.wait_for(lambda: scheduled_condition(sim, "big"), what="condition")
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert cond["message"] == "0/1 nodes are available: 1 Insufficient cpu."
        assert core.read_namespaced_pod("big", "default").status.phase == "Pending"
        sim.store.create("nodes", h.node("large", cpu="8"))
        h.wait_for(lambda: sim.store.get("pods", "big", "default")["spec"].get("nodeName") == "large",
                   what="bound to the new node")
        h.wait_for(lambda: (scheduled_condition(sim, "big") or {}).get("status") == "True",
                   what="PodScheduled=True")


def test_higher_priority_pods_bind_first_when_room_appears() -> None:
    """activeQ is ordered by priority, then by queueing time (PrioritySort): when a node joins
    with room for one pod, a system-node-critical pod queued after a Pending default-priority
    pod binds first, and nothing is preempted. (A FIFO queue bound the older pod, and the
    critical one then preempted it: a new Karpenter node's DaemonSet pods evicting the
    workload pods that had just landed there.)"""
    with testing.running_cluster(time_scale=SCALE) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())

        def pod(name: str, **spec: Any) -> dict[str, Any]:
            return {"metadata": {"name": name}, "spec": {"containers": [
                {"name": "c", "image": "nginx:1.27", "resources": {"requests": {"cpu": "600m"}}}], **spec}}

        core.create_namespaced_pod("default", pod("app"))
        h.wait_for(lambda: scheduled_condition(sim, "app"), what="app Unschedulable")
        core.create_namespaced_pod("default", pod("zz-agent", priorityClassName="system-node-critical"))
        h.wait_for(lambda: scheduled_condition(sim, "zz-agent"), what="agent Unschedulable")
        # past both pods' backoff (10 s at most): within it, backoffQ is ordered by when the
        # backoff ends before priority, and the pod that failed first may be tried first
        sim.clock.advance(11)
        sim.store.create("nodes", h.node("new", cpu="1"))
        h.wait_for(lambda: sim.store.get("pods", "zz-agent", "default")["spec"].get("nodeName") == "new",
                   what="the critical pod bound")
        app = sim.store.get("pods", "app", "default")
        assert app["spec"].get("nodeName") is None and "deletionTimestamp" not in app["metadata"]
        assert (scheduled_condition(sim, "app") or {}).get("reason") == "Unschedulable"


def test_among_equal_priorities_the_pod_that_failed_first_binds_first() -> None:
    """A pod moved back from unschedulableQ keeps the timestamp of its last failed attempt
    (AddUnschedulableIfNotPresent: "Refresh the timestamp since the pod is re-added"): the
    pod that has waited longest gets the room a new node brings. (A flush in name order gave
    a new Karpenter node's room to a random mix of every surge's pods, so no surge was
    whole by the reclaim.)"""
    with testing.running_cluster(time_scale=SCALE) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())

        def pod(name: str) -> dict[str, Any]:
            return {"metadata": {"name": name}, "spec": {"containers": [
                {"name": "c", "image": "nginx:1.27", "resources": {"requests": {"cpu": "600m"}}}]}}

        for name in ("waited-longest", "a-newcomer"):  # the newcomer sorts first by name
            core.create_namespaced_pod("default", pod(name))
            h.wait_for(lambda n=name: scheduled_condition(sim, n), what=f"{name} Unschedulable")
        sim.clock.advance(11)  # past both pods' backoff
        sim.store.create("nodes", h.node("new", cpu="1"))
        h.wait_for(lambda: sim.store.get("pods", "waited-longest", "default")["spec"].get("nodeName") == "new",
                   what="the pod that waited longest bound")
        assert sim.store.get("pods", "a-newcomer", "default")["spec"].get("nodeName") is None


def test_cordon_taints_and_affinity_in_the_running_cluster() -> None:
    with testing.running_cluster(time_scale=SCALE) as sim:
        sim.store.create("nodes", h.node("spot", labels={"node.kubernetes.io/capacity": "spot"},
                                         taints=[{"key": "spot", "value": "true", "effect": "NoSchedule"}]))
        sim.store.create("nodes", h.node("od", labels={"node.kubernetes.io/capacity": "on-demand"}))
        sim.store.create("nodes", h.node("od-cordoned",
                                         labels={"node.kubernetes.io/capacity": "on-demand"}))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        core.patch_node("od-cordoned", {"spec": {"unschedulable": True}})
        spot_pod = {"metadata": {"name": "s"}, "spec": {
            "containers": [{"name": "c", "image": "nginx:1.27"}],
            "tolerations": [{"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "node.kubernetes.io/capacity", "operator": "In", "values": ["spot"]}]}}]}}}}
        core.create_namespaced_pod("default", spot_pod)
        for i in range(3):
            core.create_namespaced_pod("default", {"metadata": {"name": f"plain-{i}"}, "spec": {
                "containers": [{"name": "c", "image": "nginx:1.27"}]}})
        h.wait_for(lambda: all(p["spec"].get("nodeName") for p in sim.store.list("pods", "default")[0]),
                   what="all bound")
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in sim.store.list("pods", "default")[0]}
        assert nodes["s"] == "spot"
        assert {nodes[f"plain-{i}"] for i in range(3)} == {"od"}


def test_stop_ends_every_controller_thread() -> None:
    import threading

    from spotguard_sim import clock, controllers, store

    s = store.Store(clock.Clock(time_scale=SCALE))
    s.create("nodes", h.node("n1"))
    running = controllers.start_all(s, drainer=True)
    s.create("pods", {"metadata": {"name": "p", "namespace": "default"},
                      "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}})
    h.wait_for(lambda: h.is_ready(s.get("pods", "p", "default")), what="ready")
    running.stop()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("sim-") and t.is_alive()]
    assert alive == []


# -- backoffQ, driven by hand (the loop's threads not started, simulated time moved by the test) --


def _loop() -> Any:
    from spotguard_sim import clock, store
    from spotguard_sim.controllers import scheduling

    return scheduling.SchedulerLoop(store.Store(clock.Clock(time_scale=1.0, start=1_000.25)))


def _add(loop: Any, resource: str, obj: dict[str, Any]) -> None:
    if resource == "pods":
        obj = {"metadata": {"name": obj["name"], "namespace": "default"}, "spec": {"containers": [
            {"name": "c", "image": "nginx:1.27", "resources": {"requests": {"cpu": obj["cpu"]}}}]}}
    loop.handle("ADDED", resource, loop.store.create(resource, obj))


def _next_within(loop: Any, seconds: float) -> Any:
    """The key the loop pops next, or None when none comes within ``seconds`` (real)."""
    import threading

    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(loop._next()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        loop.stop()
        t.join(2)
        return None
    return got[0]


def test_a_pod_still_in_its_backoff_waits_behind_the_pods_in_active_queue() -> None:
    """A cluster change moves an unschedulable pod whose backoff (1 s, doubling per attempt)
    has not ended to backoffQ, not activeQ (movePodsToActiveOrBackoffQueue): a pod created
    since binds first, though the backed-off one was queued earlier. (Before, every pod moved
    straight to activeQ: a pod that kept failing was retried first at every cluster change.)"""
    loop = _loop()
    _add(loop, "nodes", h.node("small", cpu="1"))
    _add(loop, "pods", {"name": "old", "cpu": "2"})
    for _ in range(2):  # two failed attempts: a backoff of 2 s from the last
        key = _next_within(loop, 2)
        assert key == ("default", "old")
        assert loop.schedule_one(key) is None
        loop._flush_unschedulable()
    _add(loop, "pods", {"name": "new", "cpu": "2"})
    _add(loop, "nodes", h.node("large", cpu="2"))  # room for one of them
    first = _next_within(loop, 2)
    assert first == ("default", "new")
    assert loop.schedule_one(first) == "large"


def test_with_active_queue_empty_a_backed_off_pod_is_tried_at_once() -> None:
    """SchedulerPopFromBackoffQ (beta, on by default since 1.33): when activeQ is empty, the
    head of backoffQ is popped before its backoff ends."""
    loop = _loop()
    _add(loop, "nodes", h.node("small", cpu="1"))
    _add(loop, "pods", {"name": "big", "cpu": "2"})
    key = _next_within(loop, 2)
    assert loop.schedule_one(key) is None
    _add(loop, "nodes", h.node("large", cpu="2"))  # the cluster change, within its 1 s backoff
    assert _next_within(loop, 2) == ("default", "big")


def test_a_cluster_change_while_a_pod_is_tried_is_not_missed() -> None:
    """A node that joins while a pod is being scheduled (after the attempt read the cache)
    sends the pod, when the attempt fails, to backoffQ rather than unschedulableQ
    (moveRequestCycle): it is tried again without waiting for another change. (Before, it
    waited in unschedulableQ for the next change or the 30 s flush.)"""
    loop = _loop()
    _add(loop, "nodes", h.node("small", cpu="1"))
    _add(loop, "pods", {"name": "big", "cpu": "2"})
    key = _next_within(loop, 2)
    loop._flush_unschedulable()  # a node change while the pod is in flight
    assert loop.schedule_one(key) is None  # the attempt had read the cluster before it
    assert _next_within(loop, 2) == ("default", "big")


def test_backoff_doubles_per_attempt_up_to_ten_seconds() -> None:
    """calculateBackoffDuration: 1 s after the first failed attempt, doubling, 10 s at most;
    the end aligned to the whole second it falls in (alignToWindow)."""
    loop = _loop()
    key = ("default", "p")
    loop._failed_at[key] = 1_000.25
    ends = []
    for attempts in range(0, 7):
        loop._attempts[key] = attempts
        ends.append(loop._backoff_ends(key))
    assert ends == [0.0, 1_001.0, 1_002.0, 1_004.0, 1_008.0, 1_010.0, 1_010.0]


def test_the_room_a_preemption_frees_is_held_for_the_preemptor() -> None:
    """A pod nominated to a node by its preemption has its requests counted there for every
    pod of no higher priority (RunFilterPluginsWithNominatedPods): while the preemptor waits
    in backoffQ, a lower-priority pod tried first does not take the room its victim left.
    (Before, it did, and the preemptor preempted again: 77 preemptions on
    medium-karpenter.yaml, DaemonSet pods evicting workload pods one after another.)"""
    loop = _loop()
    _add(loop, "nodes", h.node("n", cpu="1"))
    victim = loop.store.create("pods", {"metadata": {"name": "victim", "namespace": "default"}, "spec": {
        "nodeName": "n", "containers": [{"name": "c", "image": "nginx:1.27",
                                         "resources": {"requests": {"cpu": "1"}}}]}})
    loop.handle("ADDED", "pods", victim)
    critical = loop.store.create("pods", {"metadata": {"name": "critical", "namespace": "default"}, "spec": {
        "priorityClassName": "system-node-critical", "containers": [{"name": "c", "image": "nginx:1.27",
                                                "resources": {"requests": {"cpu": "1"}}}]}})
    loop.handle("ADDED", "pods", critical)
    _add(loop, "pods", {"name": "filler", "cpu": "1"})
    key = _next_within(loop, 2)
    assert key == ("default", "critical")
    assert loop.schedule_one(key) is None  # it preempts the victim and is nominated to n
    assert sim_pod(loop, "critical")["status"]["nominatedNodeName"] == "n"
    loop.handle("DELETED", "pods", victim)  # the victim is gone: its room is free
    filler = _next_within(loop, 2)
    assert filler == ("default", "filler")  # activeQ first: the preemptor backs off
    assert loop.schedule_one(filler) is None
    assert _next_within(loop, 2) == ("default", "critical")
    assert loop.schedule_one(("default", "critical")) == "n"


def sim_pod(loop: Any, name: str) -> dict[str, Any]:
    return loop.store.get("pods", name, "default")
