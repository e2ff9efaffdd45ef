"""The DaemonSet controller against the simulated cluster, through the official
client: one pod per eligible node, the automatic daemon tolerations, pods that
take node capacity, status fields, rolling updates, and the shipped scenarios.
https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from spotguard_sim import scenario, testing
from spotguard_sim.controllers import daemonset as ds_ctl

from tests.sim import controller_helpers as h

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim() -> Iterator[Any]:
    with testing.running_cluster(time_scale=50.0, ready_delay_seconds=1.0) as cluster:
        cluster.store.create("nodes", h.node("n0", zone="a", labels={"role": "web"}))
        cluster.store.create("nodes", h.node("n1", zone="b", labels={"role": "web"}))
        cluster.store.create("nodes", h.node("n2", zone="c", taints=[
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]))
        yield cluster


def apps(sim: Any) -> kubernetes.client.AppsV1Api:
    return kubernetes.client.AppsV1Api(sim.api_client())


def daemonset(name: str, *, cpu: str = "100m", **spec: Any) -> dict[str, Any]:
    template = h.template(name, cpu=cpu, **spec)
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": template}}


def bound(sim: Any, app: str) -> dict[str, str]:
    """node -> pod name of the app's live bound pods."""
    return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in h.pods_of(sim.store, app)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}


def test_one_pod_per_node_that_tolerates_and_matches(sim: Any) -> None:
    apps(sim).create_namespaced_daemon_set("default", daemonset("agent"))
    h.wait_for(lambda: set(bound(sim, "agent")) == {"n0", "n1"}, what="a pod on n0 and n1")
    # the tainted node gets none; its status says so, and the official client reads it
    status = h.wait_for(lambda: (s := apps(sim).read_namespaced_daemon_set("agent", "default").status)
                        .number_ready == 2 and s, what="status")
    assert (status.desired_number_scheduled, status.current_number_scheduled,
            status.number_misscheduled, status.number_available) == (2, 2, 0, 2)
    pod = next(p for p in h.pods_of(sim.store, "agent") if p["spec"]["nodeName"] == "n0")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}
    keys = {(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]}
    assert {(t["key"], t["effect"]) for t in ds_ctl.DAEMON_TOLERATIONS} <= keys
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["apiVersion"], ref["kind"], ref["controller"]) == ("apps/v1", "DaemonSet", True)


def test_node_selector_tolerations_and_new_nodes(sim: Any) -> None:
    apps(sim).create_namespaced_daemon_set("default", daemonset(
        "gpu", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu",
                             "effect": "NoSchedule"}]))
    apps(sim).create_namespaced_daemon_set("default", daemonset("web", nodeSelector={"role": "web"}))
    h.wait_for(lambda: set(bound(sim, "gpu")) == {"n0", "n1", "n2"}, what="gpu agent everywhere")
    h.wait_for(lambda: set(bound(sim, "web")) == {"n0", "n1"}, what="web agent on role=web")
    sim.store.create("nodes", h.node("n3", zone="a", labels={"role": "web"}))
    h.wait_for(lambda: set(bound(sim, "web")) == {"n0", "n1", "n3"}, what="a pod on the new node")
    # relabelled away: the pod goes (it is misscheduled)
    sim.store.patch("nodes", "n0", {"metadata": {"labels": {"role": "db"}}}, "merge")
    h.wait_for(lambda: set(bound(sim, "web")) == {"n1", "n3"}, what="the pod leaves n0")


def test_cordoned_nodes_still_get_daemon_pods(sim: Any) -> None:
    """The controller adds node.kubernetes.io/unschedulable:NoSchedule to every daemon pod."""
    kubernetes.client.CoreV1Api(sim.api_client()).patch_node("n1", {"spec": {"unschedulable": True}})
    apps(sim).create_namespaced_daemon_set("default", daemonset("agent"))
    h.wait_for(lambda: set(bound(sim, "agent")) == {"n0", "n1"}, what="a pod on the cordoned node")


def test_a_new_noschedule_taint_keeps_the_daemon_pod_a_noexecute_one_removes_it(sim: Any) -> None:
    """NodeShouldRunDaemonPod: an untolerated NoSchedule taint stops new daemon pods only
    (shouldContinueRunning); an untolerated NoExecute taint removes the pod. spotguard's own
    taint on a doomed node is NoSchedule: the node's CNI and log agent keep running."""
    core = kubernetes.client.CoreV1Api(sim.api_client())
    apps(sim).create_namespaced_daemon_set("default", daemonset("agent"))
    h.wait_for(lambda: set(bound(sim, "agent")) == {"n0", "n1"}, what="two pods")
    before = bound(sim, "agent")
    core.patch_node("n1", {"spec": {"taints": [{"key": "spotguard.io/interruption", "value": "x",
                                                "effect": "NoSchedule"}]}})
    h.wait_for(lambda: (s := apps(sim).read_namespaced_daemon_set("agent", "default").status)
               .number_misscheduled == 1 and s.desired_number_scheduled == 1, what="status: n1 misscheduled")
    assert bound(sim, "agent") == before  # the pod on n1 is still there, the same one
    core.patch_node("n1", {"spec": {"taints": [{"key": "example.com/evict", "value": "x", "effect": "NoExecute"}]}})
    h.wait_for(lambda: set(bound(sim, "agent")) == {"n0"}, what="the pod leaves n1")


def test_daemon_pods_take_node_capacity(sim: Any) -> None:
    """A node's pod slots and CPU go to its daemon pods first; a workload that fitted before
    no longer does (https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/
    describes allocatable: what daemon pods use is not available to others)."""
    sim.store.create("nodes", h.node("small", zone="a", cpu="1", pods="2", labels={"role": "small"}))
    apps(sim).create_namespaced_daemon_set("default", daemonset("agent", cpu="600m"))
    h.wait_for(lambda: "small" in bound(sim, "agent"), what="the agent on the small node")
    apps(sim).create_namespaced_deployment("default", h.deployment(
        "app", 2, cpu="300m", nodeSelector={"role": "small"}))
    h.wait_for(lambda: len(h.pods_of(sim.store, "app")) == 2, what="two app pods")
    h.wait_for(lambda: sorted(bool(p["spec"].get("nodeName")) for p in h.pods_of(sim.store, "app"))
               == [False, True], what="one app pod pending: 2 pod slots, 1 CPU")


def test_rolling_update_replaces_pods_max_unavailable_at_a_time(sim: Any) -> None:
    api = apps(sim)
    body = daemonset("agent")
    body["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    api.create_namespaced_daemon_set("default", body)
    h.wait_for(lambda: len(bound(sim, "agent")) == 3 and all(
        h.is_ready(p) for p in h.pods_of(sim.store, "agent")), what="three ready pods")
    first = set(bound(sim, "agent").values())
    api.patch_namespaced_daemon_set("agent", "default", {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "nginx:1.28"}]}}}})
    seen_unavailable = []

    def rolled() -> bool:
        pods = [p for p in h.pods_of(sim.store, "agent") if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in pods if h.is_ready(p)]
        seen_unavailable.append(3 - len(ready))
        return len(ready) == 3 and all(p["spec"]["containers"][0]["image"] == "nginx:1.28" for p in ready)

    h.wait_for(rolled, timeout=20, what="the rollout")
    assert not first & set(bound(sim, "agent").values())
    status = api.read_namespaced_daemon_set("agent", "default").status
    h.wait_for(lambda: api.read_namespaced_daemon_set("agent", "default").status
               .updated_number_scheduled == 3, what="updatedNumberScheduled")
    assert status.observed_generation == 2
    assert max(seen_unavailable) <= 2  # maxUnavailable 1 (plus the one being created)


def test_shipped_scenarios_carry_system_daemonsets() -> None:
    small = [o for o in scenario.load(REPO / "infra/scenarios/small.yaml") if o["kind"] == "DaemonSet"]
    large = [o for o in scenario.load(REPO / "infra/scenarios/large.yaml") if o["kind"] == "DaemonSet"]
    assert small == large == scenario.system_daemonsets()
    assert {o["metadata"]["namespace"] for o in small} == {"kube-system"}


def test_small_scenario_runs_a_daemon_pod_of_each_on_every_node() -> None:
    with testing.running_cluster(REPO / "infra/scenarios/small.yaml", time_scale=20.0) as sim:
        core = kubernetes.client.CoreV1Api(sim.api_client())
        # read from the store: the scenario's nodeInfo is not yet complete enough for list_node()
        nodes = [n["metadata"]["name"] for n in sim.store.list("nodes")[0]]

        def placed() -> bool:
            pods = core.list_namespaced_pod("kube-system").items
            return len([p for p in pods if p.spec.node_name and p.status.phase == "Running"]) == 4 * len(nodes)

        h.wait_for(placed, timeout=30, what="4 daemon pods per node")
        for ds in kubernetes.client.AppsV1Api(sim.api_client()).list_namespaced_daemon_set("kube-system").items:
            h.wait_for(lambda name=ds.metadata.name: kubernetes.client.AppsV1Api(sim.api_client())
                       .read_namespaced_daemon_set(name, "kube-system").status.number_ready == len(nodes),
                       what=f"{ds.metadata.name} ready")
        pods = core.list_namespaced_pod("kube-system").items
        assert all(p.spec.priority == 2_000_001_000 for p in pods)  # system-node-critical
