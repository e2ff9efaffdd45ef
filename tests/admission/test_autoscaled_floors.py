"""Floors on autoscaled capacity, end to end through the served webhook (issue 23, item 1).

GIVEN a simulated cluster whose nodes are launched by Karpenter (a NodePool allowing spot
and on-demand) or by the Cluster Autoscaler (an on-demand node group at 0), with no
on-demand node at the start and a spot node that has room, and the shipped webhook
(``spotguard serve admission``, real TLS) running as its service account with only the
roles the kustomize base ships (the simulated cluster authorizes as kube-apiserver's
RBAC does), WHEN Deployments and StatefulSets are created, THEN their floor pods keep the
on-demand requirement, go Pending, the autoscaler launches an on-demand node and they run
there; the webhook reports no degraded condition (nothing is wrong: the node is coming).
Where the NodePool API is missing (404) or forbidden (403), the existing nodes decide as
before (floor pods on spot, said loudly) and no pod is ever blocked.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard.admission import registration
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects, testing

from tests.admission import harness, servers
from tests.security import test_rbac

NS = harness.NS
SCALE = 10.0
NODE_CLASS = objects.node_class()


def settings(**capacity: Any) -> dict[str, Any]:
    timings = {"launchToReadySeconds": {"min": 30, "max": 40}, **capacity}
    return {"apiVersion": "sim.spotguard.io/v1", "kind": "Settings", "metadata": {"name": "t"}, "capacity": timings}


def nodepool(capacity_types: tuple[str, ...]) -> dict[str, Any]:
    return objects.nodepool(capacity_types=capacity_types, after="Never")


def spot_node() -> dict[str, Any]:
    """A spot node with room (launched earlier), labelled as Karpenter labels its nodes."""
    return harness.node("spot-0", {"karpenter.sh/capacity-type": "spot"})


def namespaces() -> list[dict[str, Any]]:
    return [objects.namespace(n) for n in (NS, "spotguard", "default")]


def karpenter_cluster(capacity_types: tuple[str, ...] = ("spot", "on-demand")) -> list[dict[str, Any]]:
    return [settings(), NODE_CLASS, nodepool(capacity_types), *namespaces(), spot_node()]


def autoscaler_cluster() -> list[dict[str, Any]]:
    groups = [
        {"name": "on-demand", "instanceType": "m5.xlarge", "capacityType": "on-demand", "minSize": 0, "maxSize": 3,
         "zones": ["us-east-1a"]},
        {"name": "spot", "instanceType": "m5.xlarge", "capacityType": "spot", "minSize": 1, "maxSize": 3,
         "zones": ["us-east-1a"]},
    ]  # fmt: skip
    return [settings(clusterAutoscaler={"scanIntervalSeconds": 10, "nodeGroups": groups}), *namespaces()]


class Served:
    def __init__(self, k: kube.Kube, sim: testing.SimCluster, server: servers.Server) -> None:
        self.k, self.sim, self.server = k, sim, server

    def readyz(self) -> requests.Response:
        return requests.get(self.server.url + "/readyz", verify=self.server.ca, timeout=5)


CLUSTERROLES = r.Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False)


@contextlib.contextmanager
def serving(
    workdir: Path,
    scenario: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    *,
    strip_nodepools: bool = False,
    no_nodepool_api: bool = False,
) -> Iterator[Served]:
    """The cluster, the shipped RBAC (the webhook runs as its service account), one served
    webhook registered as shipped. ``strip_nodepools``: the admission role without its
    NodePool read (a cluster whose role predates it); ``no_nodepool_api``: every NodePool
    list answered 404, as where Karpenter's CRDs are not installed (from before the webhook
    starts: it reads them for its readiness report too)."""
    with testing.running_cluster(scenario, time_scale=SCALE, termination_seconds=0.2) as sim:
        if no_nodepool_api:
            sim.faults.set(verb="list", resource="nodepools", error_rate=1.0, status=404)
        kubeconfigs = test_rbac.install_rbac(sim, "kubernetes/base", workdir)
        k = kube.Kube(sim.api_client())
        if strip_nodepools:
            role = k.get(CLUSTERROLES, "spotguard-admission")
            role["rules"] = [rule for rule in role["rules"] if "nodepools" not in rule.get("resources", [])]
            k.replace(CLUSTERROLES, role)
        tls = servers.make_certs(workdir / "tls")
        process_env = {**harness.LOADED_MACHINE, **(env or {})}
        with servers.running(tls, workdir, kubeconfig=kubeconfigs["admission"], env=process_env) as server:
            ca = base64.b64encode(Path(tls.ca_cert).read_bytes()).decode()
            hook = registration.webhook_configuration(server.url + "/mutate", ca, timeoutSeconds=30)
            k.create(r.MUTATINGWEBHOOKCONFIGURATIONS, hook)
            yield Served(k, sim, server)


def on_demand_pods(s: Served, app: str, replicas: int) -> tuple[int, int, set[str]]:
    """Once every pod of ``app`` runs: (on-demand by node, on-demand by label, their nodes)."""
    pods = harness.running(s.k, app, replicas, timeout=180)
    by_node, by_label = harness.on_demand(s.k, pods)
    caps = harness.capacities(s.k)
    nodes = {p["spec"]["nodeName"] for p in pods if caps.get(p["spec"]["nodeName"]) is Capacity.ON_DEMAND}
    return by_node, by_label, nodes


def create_workloads(s: Served) -> None:
    s.k.create(r.DEPLOYMENTS, harness.deployment("api", 3), NS)  # floor 1
    s.k.create(r.STATEFULSETS, harness.statefulset("db", 3), NS)  # floor 3 // 2 + 1 = 2


def assert_floors_on_launched_on_demand(s: Served, launched_by: str) -> None:
    assert on_demand_pods(s, "api", 3)[:2] == (1, 1)
    by_node, by_label, nodes = on_demand_pods(s, "db", 3)
    assert (by_node, by_label) == (2, 2)
    # THEN the on-demand nodes are the autoscaler's launches (none existed at the start)
    launched = {n["metadata"]["name"] for n in s.k.list(r.NODES) if launched_by in n["metadata"].get("labels", {})}
    assert nodes and nodes <= launched
    # AND nothing was reported as wrong: the node was coming
    events = s.k.list(r.EVENTS, NS) + s.k.list(r.EVENTS, "spotguard")
    assert not [e for e in events if e.get("reason") in ("NoOnDemandNodes", "AdmissionDegraded")]
    assert harness.metric(s.server, "spotguard_admission_unplaceable_total", placement="on-demand") == 0
    answer = s.readyz()
    assert answer.status_code == 200 and "on-demand" not in answer.text


@pytest.mark.parametrize("capacity_types", [("spot", "on-demand"), ()], ids=["spot-and-on-demand", "unstated"])
def test_on_karpenter_floor_pods_wait_for_a_launched_on_demand_node(
    tmp_path: Path, capacity_types: tuple[str, ...]
) -> None:
    # GIVEN no on-demand node, a spot node with room, and a NodePool allowing spot and
    # on-demand (or stating no capacity type: every type allowed)
    with serving(tmp_path, karpenter_cluster(capacity_types)) as s:
        assert not [n for n, c in harness.capacities(s.k).items() if c is Capacity.ON_DEMAND]
        # WHEN the workloads are created
        create_workloads(s)
        # THEN their floors run on on-demand nodes Karpenter launched for them
        assert_floors_on_launched_on_demand(s, "karpenter.sh/nodepool")


def test_with_the_cluster_autoscaler_floor_pods_wait_for_the_on_demand_group(tmp_path: Path) -> None:
    # GIVEN an on-demand node group at 0 (only the spot group's node is up), and the setting on
    with serving(tmp_path, autoscaler_cluster(), {"SPOTGUARD_ON_DEMAND_LAUNCHABLE": "true"}) as s:
        harness.wait_for(lambda: len(s.k.list(r.NODES)) == 1, 60, "the spot group's node")
        assert not [n for n, c in harness.capacities(s.k).items() if c is Capacity.ON_DEMAND]
        # WHEN the workloads are created
        create_workloads(s)
        # THEN the Cluster Autoscaler grows the on-demand group and the floors run there
        assert_floors_on_launched_on_demand(s, "eks.amazonaws.com/nodegroup")


def spot_only_outcome(s: Served, said: str = "") -> None:
    """Floor pods placed on spot (the existing nodes decide), said loudly, never blocked."""
    s.k.create(r.DEPLOYMENTS, harness.deployment("api", 2), NS)
    assert on_demand_pods(s, "api", 2)[:2] == (0, 0)
    harness.wait_for(
        lambda: any(e.get("reason") == "NoOnDemandNodes" for e in s.k.list(r.EVENTS, NS)), 30, "NoOnDemandNodes"
    )
    assert said in s.server.log.read_text()  # the log line that says why


def test_a_spot_only_nodepool_launches_no_on_demand_and_floors_run_on_spot_with_a_warning(tmp_path: Path) -> None:
    # GIVEN only spot can ever be launched: nothing can provide on-demand, said loudly
    with serving(tmp_path, karpenter_cluster(capacity_types=("spot",))) as s:
        spot_only_outcome(s)
        answer = s.readyz()
        assert answer.status_code == 200 and "nothing can launch one" in answer.text


def test_a_forbidden_nodepool_read_falls_back_to_the_existing_nodes(tmp_path: Path) -> None:
    with serving(tmp_path, karpenter_cluster(), strip_nodepools=True) as s:
        spot_only_outcome(s, "reading Karpenter NodePools is forbidden (403)")


def test_a_missing_nodepool_api_falls_back_to_the_existing_nodes(tmp_path: Path) -> None:
    with serving(tmp_path, karpenter_cluster(), no_nodepool_api=True) as s:
        spot_only_outcome(s, "no Karpenter NodePool API (404)")


def test_a_statefulset_that_is_all_floor_is_kept_from_consolidation(tmp_path: Path) -> None:
    """issue 23 item 4: floors expressed so consolidation respects them. A StatefulSet whose
    every replica is its floor (cache: 1 replica) cannot lose a pod to a drain without going
    below its floor, nor be replaced before its pod goes: its pod asks both autoscalers to
    leave its node alone. One with a pod to spare (db: 3, floor 2) does not: the eviction
    guard keeps its floor, and its node may be consolidated."""
    # GIVEN Karpenter consolidating at once
    consolidating = objects.nodepool(policy="WhenEmptyOrUnderutilized", after="0s")
    with serving(tmp_path, [settings(), NODE_CLASS, consolidating, *namespaces(), spot_node()]) as s:
        # WHEN the StatefulSets are created
        s.k.create(r.STATEFULSETS, harness.statefulset("cache", 1), NS)
        s.k.create(r.STATEFULSETS, harness.statefulset("db", 3), NS)
        cache = harness.running(s.k, "cache", 1, timeout=180)
        db = harness.running(s.k, "db", 3, timeout=180)
        # THEN cache's pod carries the autoscalers' keep-out keys, and says spotguard set them
        notes = cache[0]["metadata"].get("annotations") or {}
        assert notes.get("karpenter.sh/do-not-disrupt") == "true", notes
        assert notes.get("cluster-autoscaler.kubernetes.io/safe-to-evict") == "false", notes
        assert notes.get("spotguard.io/floor-protected") == (
            "cluster-autoscaler.kubernetes.io/safe-to-evict,karpenter.sh/do-not-disrupt"
        )
        # AND db's do not
        for pod in db:
            assert "karpenter.sh/do-not-disrupt" not in (pod["metadata"].get("annotations") or {}), pod["metadata"]
