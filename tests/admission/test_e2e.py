"""End to end on the simulated cluster, through real HTTPS webhooks.

Three separate ``spotguard serve admission`` processes (gunicorn, TLS) sit
behind a round-robin TCP load balancer; the simulated API server calls them
from a MutatingWebhookConfiguration (``clientConfig.url`` + ``caBundle``) on
every pod CREATE, as kube-apiserver does. Its controllers create the pods
(ReplicaSet slow-start batches run concurrently) and its scheduler places
them; floors are counted by the node's capacity label and by the
``spotguard.io/placement`` label.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import requests
from spotguard.admission import registration
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import objects, testing

from tests.admission import balancer, servers

CAPACITY = "node.kubernetes.io/capacity"
NS = "shop"


def node(name: str, capacity: str, zone: str) -> dict[str, Any]:
    return objects.node(
        name,
        capacity,
        zone=zone,
        provider=objects.provider_id(zone, f"i-{abs(hash(name)) % 10**12:012d}"),
        labels={"karpenter.sh/capacity-type": capacity},
        ready=False,
    )


SCENARIO = (
    [objects.namespace(n) for n in (NS, "spotguard", "kube-system")]
    + [node(f"od-{i}", "on-demand", f"us-east-1{'abc'[i % 3]}") for i in range(3)]
    + [node(f"spot-{i}", "spot", f"us-east-1{'abc'[i % 3]}") for i in range(6)]
)


# A shorter trust window than the default (3 s) so the repeated bursts below need not wait long.
SERVER_ENV = {
    "SPOTGUARD_NAMESPACE": "spotguard",
    "SPOTGUARD_ADMISSION_TRUST_SECONDS": "1",
    "SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS": "1",
}


@dataclass
class Env:
    k: kube.Kube
    sim: Any
    lb: balancer.Balancer
    servers: list[servers.Server]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("admission-e2e")
    tls = servers.make_certs(workdir / "tls")
    with testing.running_cluster(SCENARIO, termination_seconds=0.2) as sim, contextlib.ExitStack() as stack:
        running = stack.enter_context(
            servers.running_many(3, tls, workdir, kubeconfig=sim.kubeconfig, workers=1, env=SERVER_ENV)
        )
        lb = balancer.Balancer([("127.0.0.1", int(s.url.rsplit(":", 1)[1])) for s in running])
        stack.callback(lb.close)
        k = kube.Kube(sim.api_client())
        k.create(
            r.MUTATINGWEBHOOKCONFIGURATIONS, webhook_configuration(f"https://127.0.0.1:{lb.port}/mutate", tls.ca_cert)
        )
        yield Env(k, sim, lb, running)


def webhook_configuration(url: str, ca: Path) -> dict[str, Any]:
    """The shipped webhook configuration (``infra/kubernetes/base/webhook.yaml``), pointed at ``url``."""
    return registration.webhook_configuration(url, base64.b64encode(ca.read_bytes()).decode())


def template(name: str, template_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    containers = [objects.container("app", "nginx:1.27", cpu="10m", memory="16Mi")]
    return objects.pod_template(
        name, containers=containers, annotations=template_annotations or {}, terminationGracePeriodSeconds=0
    )


def deployment(name: str, replicas: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return objects.deployment(name, replicas, namespace=NS, template=template(name), annotations=annotations or {})


def statefulset(name: str, replicas: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return objects.statefulset(
        name, replicas, namespace=NS, template=template(name), annotations=annotations or {}, policy="Parallel"
    )


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def live_pods(e: Env, app: str) -> list[dict[str, Any]]:
    pods = e.k.list(r.PODS, NS, label_selector=f"app={app}")
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def counts(e: Env, app: str, replicas: int) -> tuple[int, int]:
    """(on-demand by node capacity, on-demand by placement label) once all ``replicas`` are scheduled."""
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"].get(CAPACITY) for n in e.k.list(r.NODES)}

    def settled() -> bool:
        pods = e.k.list(r.PODS, NS, label_selector=f"app={app}")
        return len(pods) == replicas and all(
            p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp") for p in pods
        )

    wait_for(settled, what=f"{replicas} scheduled pods of {app}")
    pods = live_pods(e, app)
    by_node = sum(1 for p in pods if nodes.get(p["spec"]["nodeName"]) == "on-demand")
    by_label = sum(1 for p in pods if p["metadata"].get("labels", {}).get("spotguard.io/placement") == "on-demand")
    assert all("spotguard.io/placement" in p["metadata"].get("labels", {}) for p in pods), "a pod was not admitted"
    return by_node, by_label


def admitted(server: servers.Server) -> float:
    """Reviews a server process answered with a patch, from its own /metrics."""
    text = requests.get(server.url + "/metrics", verify=server.ca, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("spotguard_admission_requests_total{") and 'outcome="patched"' in line
    )


def scale(e: Env, res: r.Resource, name: str, replicas: int) -> None:
    e.k.patch(res, name, {"spec": {"replicas": replicas}}, NS)


@pytest.mark.parametrize(
    ("replicas", "annotations", "floor"),
    [
        (1, {}, 1),
        (2, {}, 1),
        (10, {}, 1),
        (60, {}, 1),
        (10, {"spotguard.io/min-on-demand": "3"}, 3),
        (60, {"spotguard.io/min-on-demand": "25%"}, 15),
    ],
)
def test_deployments_get_exactly_their_floor(env: Env, replicas: int, annotations: dict[str, str], floor: int) -> None:
    name = f"web-{replicas}-{floor}"
    env.k.create(r.DEPLOYMENTS, deployment(name, replicas, annotations), NS)
    assert counts(env, name, replicas) == (floor, floor)


@pytest.mark.parametrize(
    ("replicas", "annotations", "floor"),
    [(1, {}, 1), (3, {}, 2), (7, {}, 4), (7, {"spotguard.io/min-on-demand": "1"}, 1)],
)
def test_statefulsets_get_exactly_their_floor_by_ordinal(
    env: Env, replicas: int, annotations: dict[str, str], floor: int
) -> None:
    name = f"db-{replicas}-{floor}"
    env.k.create(r.STATEFULSETS, statefulset(name, replicas, annotations), NS)
    assert counts(env, name, replicas) == (floor, floor)
    ordinals = {
        int(p["metadata"]["name"].rsplit("-", 1)[1])
        for p in live_pods(env, name)
        if p["metadata"]["labels"]["spotguard.io/placement"] == "on-demand"
    }
    assert ordinals == set(range(floor))


def test_scaling_down_and_up_keeps_the_floor(env: Env) -> None:
    name = "scaler"
    env.k.create(r.DEPLOYMENTS, deployment(name, 8, {"spotguard.io/min-on-demand": "2"}), NS)
    assert counts(env, name, 8) == (2, 2)
    scale(env, r.DEPLOYMENTS, name, 3)
    assert counts(env, name, 3) == (2, 2)  # spot replicas go first (pod-deletion-cost)
    scale(env, r.DEPLOYMENTS, name, 12)
    assert counts(env, name, 12) == (2, 2)


def test_a_rollout_keeps_the_floor_across_both_replicasets(env: Env) -> None:
    name = "roller"
    env.k.create(r.DEPLOYMENTS, deployment(name, 6), NS)
    assert counts(env, name, 6) == (1, 1)
    env.k.patch(r.DEPLOYMENTS, name, {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}, NS)

    def rolled() -> bool:
        pods = live_pods(env, name)
        return len(pods) == 6 and all(p["metadata"].get("annotations", {}).get("rev") == "2" for p in pods)

    wait_for(rolled, what="the rollout")
    assert counts(env, name, 6) == (1, 1)


def test_three_webhook_processes_hand_out_exactly_the_floor_for_60_pods_at_once(env: Env) -> None:
    name = "burst"
    env.k.create(r.DEPLOYMENTS, deployment(name, 0, {"spotguard.io/min-on-demand": "10"}), NS)
    before = [admitted(s) for s in env.servers]
    for attempt in range(5):
        scale(env, r.DEPLOYMENTS, name, 60)
        leases = [x["metadata"].get("annotations") for x in env.k.list(r.LEASES, "spotguard")]
        assert counts(env, name, 60) == (10, 10), (attempt, leases)
        scale(env, r.DEPLOYMENTS, name, 0)
        wait_for(lambda: not env.k.list(r.PODS, NS, label_selector=f"app={name}"), what="scale to zero")
        time.sleep(2.1)  # a new burst right after: the pods just deleted held reservations
    after = [admitted(s) for s in env.servers]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)  # every process took part


def test_dry_run_creates_nothing_and_reserves_nothing(env: Env) -> None:
    name = "dry"
    env.k.create(r.DEPLOYMENTS, deployment(name, 2), NS)
    assert counts(env, name, 2) == (1, 1)
    leases = {x["metadata"]["name"]: x["metadata"]["resourceVersion"] for x in env.k.list(r.LEASES, "spotguard")}
    rs = next(x for x in env.k.list(r.REPLICASETS, NS) if x["metadata"]["name"].startswith(name + "-"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": name + "-",
            "labels": {"app": name, "pod-template-hash": rs["metadata"]["labels"]["pod-template-hash"]},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs["metadata"]["name"],
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": template(name)["spec"],
    }
    created = env.k.create(r.PODS, pod, NS, dry_run=True)
    assert created["metadata"]["labels"]["spotguard.io/placement"] == "spot"
    assert {
        x["metadata"]["name"]: x["metadata"]["resourceVersion"] for x in env.k.list(r.LEASES, "spotguard")
    } == leases
    assert len(live_pods(env, name)) == 2


def test_the_servers_stayed_up(env: Env) -> None:
    for s in env.servers:
        assert s.process.poll() is None


@pytest.mark.parametrize(
    "fault", [{"status": 500, "error_rate": 1.0}, {"timeout": True, "hold_seconds": 4.0, "error_rate": 1.0}]
)
def test_an_unreachable_lease_api_still_places_pods_within_the_webhook_timeout(env: Env, fault: dict[str, Any]) -> None:
    # The Lease API failing (500s, or holding every call past the webhook's 3 s): no review can
    # read or write a reservation; each is placed from what it knows (degraded), never blocked.
    name = f"outage-{len(fault)}"
    env.sim.faults.set(verb="*", resource="leases", **fault)
    try:
        started = time.monotonic()
        env.k.create(r.DEPLOYMENTS, deployment(name, 3), NS)
        wait_for(lambda: len(live_pods(env, name)) == 3, what="pods admitted")
        assert time.monotonic() - started < 3 * 3  # each admission answered within its 3 s timeout
        placements = [(p["metadata"].get("labels") or {}).get("spotguard.io/placement") for p in live_pods(env, name)]
        assert None not in placements, placements  # every pod placed
        assert placements.count("on-demand") >= 1  # the floor (1) on on-demand: the safe side
        annotations = [p["metadata"].get("annotations") or {} for p in live_pods(env, name)]
        assert not any("spotguard.io/reservation" in a for a in annotations)  # none written
    finally:
        env.sim.faults.clear()
    # the API is back: the next workload is placed again
    env.k.create(r.DEPLOYMENTS, deployment(name + "-after", 2), NS)
    assert counts(env, name + "-after", 2) == (1, 1)


def reviewed(server: servers.Server) -> float:
    """Every review a server process answered (any outcome), from its own /metrics."""
    text = requests.get(server.url + "/metrics", verify=server.ca, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("spotguard_admission_requests_total{")
    )


def test_daemonset_and_job_pods_are_left_alone(env: Env) -> None:
    """The cluster's own controllers create these pods through the served webhook configuration;
    spotguard places only ReplicaSet and StatefulSet pods, so they are neither reviewed nor changed."""
    apps = kubernetes.client.AppsV1Api(env.sim.api_client())
    batch = kubernetes.client.BatchV1Api(env.sim.api_client())
    before = sum(reviewed(s) for s in env.servers)
    spec = template("agent")["spec"]
    apps.create_namespaced_daemon_set(NS, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec}},
    })
    job_spec = {**spec, "restartPolicy": "Never"}
    batch.create_namespaced_job(NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "batch"},
        "spec": {"completions": 4, "parallelism": 2,
                 "template": {"metadata": {"labels": {"app": "batch"}}, "spec": job_spec}},
    })
    nodes = len(env.k.list(r.NODES))
    wait_for(lambda: len([p for p in live_pods(env, "agent") if p["spec"].get("nodeName")]) == nodes,
             what="a daemon pod on every node")
    wait_for(lambda: len(env.k.list(r.PODS, NS, label_selector="app=batch")) >= 2, what="the Job's pods")
    pods = [p for app in ("agent", "batch")
            for p in env.k.list(r.PODS, NS, label_selector=f"app={app}")]
    owners = {p["metadata"]["ownerReferences"][0]["kind"] for p in pods}
    assert owners == {"DaemonSet", "Job"}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        assert not any(k.startswith("spotguard.io/") for k in labels), p["metadata"]["name"]
        assert not any(k.startswith("spotguard.io/") for k in p["metadata"].get("annotations") or {})
        assert p["spec"].get("nodeSelector") is None
        assert p["spec"].get("priorityClassName") is None
    assert sum(reviewed(s) for s in env.servers) == before  # matchConditions kept the calls away
    apps.delete_namespaced_daemon_set("agent", NS)
    batch.delete_namespaced_job("batch", NS, propagation_policy="Background")
