"""PodDisruptionBudget status, the Eviction API and the drainer, against the
simulated cluster with the official kubernetes client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client.rest import ApiException
from spotguard_sim import testing

from tests.sim import controller_helpers as h

SCALE = 50.0


@pytest.fixture
def sim() -> Iterator[Any]:
    # replacements take 20 simulated seconds to be Ready, so a budget stays spent
    # long enough for the test to see it
    with testing.running_cluster(time_scale=SCALE, termination_seconds=1.0,
                                 ready_delay_seconds=20.0) as cluster:
        for i in range(3):
            cluster.store.create("nodes", h.node(f"n{i}", zone="abc"[i]))
        yield cluster


def pdb(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": app}}, **spec}}


def status_of(sim: Any, name: str) -> dict[str, Any]:
    return sim.store.get("poddisruptionbudgets", name, "default").get("status") or {}


def evict(sim: Any, name: str) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    core.create_namespaced_pod_eviction(name, "default", kubernetes.client.V1Eviction(
        metadata=kubernetes.client.V1ObjectMeta(name=name, namespace="default")))


def start_web(sim: Any, replicas: int = 4) -> None:
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    apps.create_namespaced_deployment("default", h.deployment("web", replicas))
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == replicas, what=f"{replicas} ready")


# https://kubernetes.io/docs/tasks/run-application/configure-pdb/#think-about-how-your-application-reacts-to-disruptions
@pytest.mark.parametrize(("spec", "expected", "desired", "allowed"), [
    ({"minAvailable": 3}, 4, 3, 1),
    ({"minAvailable": "50%"}, 4, 2, 2),
    ({"minAvailable": "30%"}, 4, 2, 2),  # rounds up: 1.2 -> 2
    ({"maxUnavailable": 1}, 4, 3, 1),
    ({"maxUnavailable": "30%"}, 4, 2, 2),  # rounds up: 1.2 -> 2 unavailable
    ({"minAvailable": 5}, 4, 5, 0),
])
def test_pdb_status(sim: Any, spec: dict[str, Any], expected: int, desired: int, allowed: int) -> None:
    start_web(sim)
    policy = kubernetes.client.PolicyV1Api(sim.api_client())
    policy.create_namespaced_pod_disruption_budget("default", pdb("budget", "web", **spec))

    def settled() -> bool:
        st = status_of(sim, "budget")
        return st.get("currentHealthy") == 4 and st.get("observedGeneration") == 1

    h.wait_for(settled, what="pdb status")
    got = policy.read_namespaced_pod_disruption_budget("budget", "default").status
    assert (got.expected_pods, got.desired_healthy, got.current_healthy, got.disruptions_allowed) == (
        expected, desired, 4, allowed)
    cond = {c.type: c for c in got.conditions}["DisruptionAllowed"]
    assert cond.status == ("True" if allowed else "False")
    assert cond.reason == ("SufficientPods" if allowed else "InsufficientPods")


def test_expected_pods_follow_the_deployment_scale(sim: Any) -> None:
    # maxUnavailable scales with the controller's replicas, not the pods that exist
    # (pkg/controller/disruption/disruption.go getExpectedScale)
    start_web(sim, 2)
    sim.store.create("poddisruptionbudgets", pdb("budget", "web", maxUnavailable="50%"))
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    apps.patch_namespaced_deployment_scale("web", "default", {"spec": {"replicas": 6}})
    h.wait_for(lambda: status_of(sim, "budget").get("expectedPods") == 6
               and status_of(sim, "budget").get("currentHealthy") == 6, what="expected 6")
    st = status_of(sim, "budget")
    assert (st["desiredHealthy"], st["disruptionsAllowed"]) == (3, 3)


# https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/#how-api-initiated-eviction-works
def test_eviction_allowed_then_refused_with_429(sim: Any) -> None:
    start_web(sim, 3)
    sim.store.create("poddisruptionbudgets", pdb("budget", "web", minAvailable=2))
    h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, what="1 allowed")
    names = sorted(p["metadata"]["name"] for p in h.ready_pods(sim.store, "web"))
    marked: list[dict[str, Any]] = []

    def seen(event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods" and obj["metadata"]["name"] == names[0]:
            marked.extend(c for c in (obj.get("status") or {}).get("conditions") or []
                          if c["type"] == "DisruptionTarget")

    sim.store.subscribe(seen)
    evict(sim, names[0])
    left = [p for p in h.pods_of(sim.store, "web") if p["metadata"]["name"] == names[0]]
    assert not left or left[0]["metadata"].get("deletionTimestamp")  # terminating or gone
    # marked before its deletion, as addConditionAndDeletePod does (eviction.go)
    assert marked and (marked[0]["status"], marked[0]["reason"], marked[0]["message"]) == (
        "True", "EvictionByEvictionAPI", "Eviction API: evicting")
    # the eviction decremented the budget at once (the controller then drops the
    # terminating pod from disruptedPods, as buildDisruptedPodMap does)
    assert status_of(sim, "budget")["disruptionsAllowed"] == 0
    with pytest.raises(ApiException) as err:
        evict(sim, names[1])
    assert err.value.status == 429
    body = json.loads(err.value.body)
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert "needs 2 healthy pods" in body["details"]["causes"][0]["message"]
    assert not sim.store.get("pods", names[1], "default")["metadata"].get("deletionTimestamp")
    # the replacement becomes Ready, the budget allows one more eviction
    h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, timeout=15,
               what="budget recovers")
    evict(sim, names[1])


# https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/ and
# pkg/registry/core/pod/storage/eviction.go: a dry run checks the budget, spends nothing
def test_dry_run_eviction_checks_the_budget_and_changes_nothing(sim: Any) -> None:
    start_web(sim, 3)
    sim.store.create("poddisruptionbudgets", pdb("budget", "web", minAvailable=2))
    h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, what="1 allowed")
    names = sorted(p["metadata"]["name"] for p in h.ready_pods(sim.store, "web"))
    core = kubernetes.client.CoreV1Api(sim.api_client())

    def dry_evict(name: str) -> None:
        core.create_namespaced_pod_eviction(
            name, "default",
            kubernetes.client.V1Eviction(metadata=kubernetes.client.V1ObjectMeta(name=name, namespace="default")),
            dry_run="All",
        )

    dry_evict(names[0])  # allowed: the budget has one disruption to spare
    assert status_of(sim, "budget")["disruptionsAllowed"] == 1  # not spent
    assert not sim.store.get("pods", names[0], "default")["metadata"].get("deletionTimestamp")
    evict(sim, names[0])  # the real one spends it
    with pytest.raises(ApiException) as err:
        dry_evict(names[1])
    assert err.value.status == 429
    assert not sim.store.get("pods", names[1], "default")["metadata"].get("deletionTimestamp")


def test_concurrent_evictions_cannot_both_use_the_last_disruption(sim: Any) -> None:
    start_web(sim, 4)
    sim.store.create("poddisruptionbudgets", pdb("budget", "web", maxUnavailable=1))
    h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, what="1 allowed")
    names = [p["metadata"]["name"] for p in h.ready_pods(sim.store, "web")]
    codes: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(names))

    def one(name: str) -> None:
        barrier.wait()
        try:
            evict(sim, name)
            code = 201
        except ApiException as exc:
            code = exc.status
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201, 429, 429, 429]


# https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/ (more than one budget -> 500)
def test_two_budgets_on_one_pod_answer_500(sim: Any) -> None:
    start_web(sim, 2)
    sim.store.create("poddisruptionbudgets", pdb("a", "web", minAvailable=1))
    sim.store.create("poddisruptionbudgets", pdb("b", "web", maxUnavailable=1))
    name = h.ready_pods(sim.store, "web")[0]["metadata"]["name"]
    with pytest.raises(ApiException) as err:
        evict(sim, name)
    assert err.value.status == 500
    assert "more than one PodDisruptionBudget" in json.loads(err.value.body)["message"]


def test_eviction_without_a_budget_deletes(sim: Any) -> None:
    start_web(sim, 1)
    name = h.ready_pods(sim.store, "web")[0]["metadata"]["name"]
    evict(sim, name)
    h.wait_for(lambda: name not in {p["metadata"]["name"] for p in h.pods_of(sim.store, "web")},
               what="pod removed")
    with pytest.raises(ApiException) as err:
        evict(sim, "nope")
    assert err.value.status == 404


def _make_unready(sim: Any, name: str) -> None:
    def edit(pod: dict[str, Any]) -> None:
        for c in pod["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "False"

    sim.store.mutate("pods", name, "default", edit)


# https://kubernetes.io/docs/tasks/run-application/configure-pdb/#unhealthy-pod-eviction-policy
def test_unhealthy_pod_eviction_policy(sim: Any) -> None:
    start_web(sim, 3)
    sim.store.create("poddisruptionbudgets", pdb("budget", "web", minAvailable=2))
    h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, what="1 allowed")
    names = sorted(p["metadata"]["name"] for p in h.ready_pods(sim.store, "web"))
    # IfHealthyBudget (default): an unready pod may go while currentHealthy >= desiredHealthy
    _make_unready(sim, names[0])
    h.wait_for(lambda: status_of(sim, "budget").get("currentHealthy") == 2, what="2 healthy")
    evict(sim, names[0])
    assert status_of(sim, "budget")["disruptionsAllowed"] == 0  # not decremented below 0
    assert "disruptedPods" not in status_of(sim, "budget")
    # now the budget is not healthy: another unready pod is protected
    h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 3, timeout=15, what="replaced")
    sim.store.mutate("poddisruptionbudgets", "budget", "default",
                     lambda o: o["spec"].__setitem__("minAvailable", 3))
    h.wait_for(lambda: status_of(sim, "budget").get("observedGeneration") == 2
               and status_of(sim, "budget").get("desiredHealthy") == 3, what="gen 2")
    victim = sorted(p["metadata"]["name"] for p in h.ready_pods(sim.store, "web"))[0]
    _make_unready(sim, victim)
    h.wait_for(lambda: status_of(sim, "budget").get("currentHealthy") == 2, what="2 healthy")
    with pytest.raises(ApiException) as err:
        evict(sim, victim)
    assert err.value.status == 429
    # AlwaysAllow lets unready pods go regardless
    sim.store.mutate("poddisruptionbudgets", "budget", "default",
                     lambda o: o["spec"].__setitem__("unhealthyPodEvictionPolicy", "AlwaysAllow"))
    evict(sim, victim)


# aws-node-termination-handler: cordon and drain at the notice, honouring budgets
# (https://kubernetes.io/docs/tasks/administer-cluster/safely-drain-node/)
def test_drainer_cordons_and_evicts_through_budgets() -> None:
    with testing.running_cluster(time_scale=SCALE, drainer=True, ready_delay_seconds=2.0) as sim:
        sim.store.create("nodes", h.node("doomed", zone="a"))
        apps = kubernetes.client.AppsV1Api(sim.api_client())
        apps.create_namespaced_deployment("default", h.deployment("web", 2))
        h.wait_for(lambda: len(h.ready_pods(sim.store, "web")) == 2, what="2 ready")
        sim.store.create("poddisruptionbudgets", pdb("budget", "web", minAvailable=1))
        h.wait_for(lambda: status_of(sim, "budget").get("disruptionsAllowed") == 1, what="budget")
        # a DaemonSet pod is left alone by the drain
        sim.store.create("pods", {"metadata": {"name": "agent", "namespace": "default",
                                               "ownerReferences": [{"apiVersion": "apps/v1",
                                                                    "kind": "DaemonSet", "name": "agent",
                                                                    "uid": "ds-uid", "controller": True}]},
                                  "spec": {"nodeName": "doomed",
                                           "containers": [{"name": "a", "image": "agent:1"}]}})
        sim.store.create("nodes", h.node("spare", zone="b"))
        min_ready: list[int] = []

        def watch(event_type: str, resource: str, obj: dict[str, Any]) -> None:
            if resource == "pods" and obj["metadata"].get("labels", {}).get("app") == "web":
                min_ready.append(len(h.ready_pods(sim.store, "web")))

        sim.store.subscribe(watch)
        sim.reclaim(["doomed"], after_seconds=120)
        h.wait_for(lambda: sim.store.get("nodes", "doomed")["spec"].get("unschedulable"),
                   what="cordoned")
        h.wait_for(lambda: all(p["spec"].get("nodeName") == "spare"
                               for p in h.pods_of(sim.store, "web"))
                   and len(h.ready_pods(sim.store, "web")) == 2, timeout=20, what="moved to spare")
        sim.store.unsubscribe(watch)
        # the budget held: at least one web pod was Ready all along
        assert min(min_ready) >= 1
        # the drain finished before the node went away; the DaemonSet pod stayed
        assert sim.store.get("nodes", "doomed")
        assert sim.store.get("pods", "agent", "default")["spec"]["nodeName"] == "doomed"
