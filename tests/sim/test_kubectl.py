"""kubectl 1.35 drives the simulated cluster: get, apply, scale, cordon, taint, drain, delete.

kubectl missing is a failure (CI installs it with scripts/install-tools).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spotguard_sim import testing

from tests.sim.conftest import deployment_manifest, kubectl_path

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def node(name: str, capacity: str, zone: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
            "node.kubernetes.io/capacity": capacity}},
        "spec": {"providerID": f"aws:///{zone}/i-0{abs(hash(name)) % 10**16:016d}"},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                   "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"}},
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    scenario = [node("kc-od-1", "on-demand", "us-east-1a"), node("kc-spot-1", "spot", "us-east-1b"),
                node("kc-spot-2", "spot", "us-east-1c")]
    with testing.running_cluster(scenario, time_scale=10.0) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kubectl(sim: testing.SimCluster) -> Kubectl:
    binary = kubectl_path()

    def run(*args: str, check: bool = True, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, "--kubeconfig", sim.kubeconfig, *args],
                                check=False, capture_output=True, text=True, input=stdin,
                                timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


def wait_for(fn: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_kubectl_version_talks_to_the_server(kubectl: Kubectl) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_version/"""
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["minor"].startswith("35")
    assert out["serverVersion"]["gitVersion"].startswith("v1.35")


def test_get_prints_tables_and_json(kubectl: Kubectl) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_get/"""
    table = kubectl("get", "nodes").stdout
    assert table.splitlines()[0].split()[:2] == ["NAME", "STATUS"]
    assert "kc-spot-1" in table
    nodes = json.loads(kubectl("get", "nodes", "-l", "node.kubernetes.io/capacity=spot",
                               "-o", "json").stdout)
    assert sorted(n["metadata"]["name"] for n in nodes["items"]) == ["kc-spot-1", "kc-spot-2"]
    assert kubectl("get", "pod", "nope", check=False).returncode != 0


def test_apply_creates_then_patches(kubectl: Kubectl, sim: testing.SimCluster,
                                    tmp_path: Path) -> None:
    """https://kubernetes.io/docs/tasks/manage-kubernetes-objects/declarative-config/
    (client-side apply: last-applied annotation, then a three-way strategic merge patch)"""
    manifest = deployment_manifest("applied", replicas=2)
    manifest["metadata"]["namespace"] = "default"
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}]
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps(manifest))
    assert "deployment.apps/applied created" in kubectl("apply", "-f", str(path)).stdout
    assert "unchanged" in kubectl("apply", "-f", str(path)).stdout
    container["env"] = [{"name": "A", "value": "2"}]
    manifest["spec"]["replicas"] = 3
    path.write_text(json.dumps(manifest))
    assert "configured" in kubectl("apply", "-f", str(path)).stdout
    live = sim.store.get("deployments", "applied", "default")
    assert live["spec"]["replicas"] == 3
    assert live["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "A", "value": "2"}]
    assert "kubectl.kubernetes.io/last-applied-configuration" in live["metadata"]["annotations"]
    wait_for(lambda: len(sim.store.list("pods", "default", "app=applied")[0]) == 3,
             what="3 pods")


def test_apply_rejects_unknown_fields(kubectl: Kubectl, tmp_path: Path) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation"""
    manifest = deployment_manifest("strict")
    manifest["spec"]["replicaz"] = 2
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(manifest))
    result = kubectl("apply", "-f", str(path), check=False)
    assert result.returncode != 0 and "replicaz" in result.stderr


def test_scale(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_scale/"""
    sim.store.create("deployments", deployment_manifest("scaled", replicas=1), namespace="default")
    assert "scaled" in kubectl("scale", "deployment/scaled", "--replicas=4").stdout
    assert sim.store.get("deployments", "scaled", "default")["spec"]["replicas"] == 4
    wait_for(lambda: len(sim.store.list("pods", "default", "app=scaled")[0]) == 4, what="4 pods")


def test_cordon_and_uncordon(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_cordon/"""
    kubectl("cordon", "kc-od-1")
    assert sim.store.get("nodes", "kc-od-1")["spec"]["unschedulable"] is True
    assert "SchedulingDisabled" in kubectl("get", "node", "kc-od-1").stdout
    kubectl("uncordon", "kc-od-1")
    assert not sim.store.get("nodes", "kc-od-1")["spec"].get("unschedulable")


def test_taint_add_and_remove(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/"""
    kubectl("taint", "nodes", "kc-spot-2", "spotguard.io/interruption=evt-1:NoSchedule")
    taints = sim.store.get("nodes", "kc-spot-2")["spec"]["taints"]
    assert {"key": "spotguard.io/interruption", "value": "evt-1", "effect": "NoSchedule"} in taints
    kubectl("taint", "nodes", "kc-spot-2", "spotguard.io/interruption:NoSchedule-")
    assert not sim.store.get("nodes", "kc-spot-2")["spec"].get("taints")


def test_drain_evicts_through_the_eviction_api(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/tasks/administer-cluster/safely-drain-node/
    (kubectl drain cordons the node, then evicts each pod with the Eviction API)"""
    sim.store.create("deployments", deployment_manifest("drained", replicas=6), namespace="default")

    def on_nodes() -> dict[str, str]:
        pods, _ = sim.store.list("pods", "default", "app=drained")
        return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods}

    wait_for(lambda: len(on_nodes()) == 6 and all(on_nodes().values()), what="6 scheduled pods")
    victim = "kc-spot-1"
    before = [n for n, node_name in on_nodes().items() if node_name == victim]
    assert before, "the scheduler spread no pod onto the node to drain"
    result = kubectl("drain", victim, "--ignore-daemonsets", "--timeout=30s")
    for name in before:
        assert f"pod/{name} evicted" in result.stdout + result.stderr
    assert sim.store.get("nodes", victim)["spec"]["unschedulable"] is True
    pods, _ = sim.store.list("pods", field_selector=f"spec.nodeName={victim}")
    assert pods == []
    wait_for(lambda: len(on_nodes()) == 6 and victim not in on_nodes().values(),
             what="replacements elsewhere")
    kubectl("uncordon", victim)


def test_delete(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_delete/"""
    sim.store.create("configmaps", {"metadata": {"name": "bye"}}, namespace="default")
    assert 'configmap "bye" deleted' in kubectl("delete", "configmap", "bye").stdout
    assert kubectl("get", "configmap", "bye", check=False).returncode != 0


def test_rollout_status_and_wait_use_watch_list(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#streaming-lists
    (sendInitialEvents=true ends the initial events with a k8s.io/initial-events-end bookmark)"""
    sim.store.create("deployments", deployment_manifest("rolled", replicas=2), namespace="default")
    out = kubectl("rollout", "status", "deployment/rolled", "--timeout=20s").stdout
    assert 'deployment "rolled" successfully rolled out' in out
    out = kubectl("wait", "--for=condition=Ready", "pod", "-l", "app=rolled", "--timeout=20s").stdout
    assert out.count("condition met") == 2


def test_spotguard_sim_serve_with_kubectl(tmp_path: Path) -> None:
    """`spotguard sim serve` writes a kubeconfig once ready; kubectl and the kubernetes
    client's load_kube_config accept it; SIGTERM stops it cleanly."""
    import os
    import signal
    import sys

    import kubernetes

    kubeconfig = tmp_path / "sim.kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotguard.cli", "sim", "serve", "--kubeconfig", str(kubeconfig),
         "--scenario", str(Path(__file__).resolve().parents[2] / "infra/scenarios/small.yaml"),
         "--time-scale", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "shared")},
    )
    try:
        wait_for(kubeconfig.exists, timeout=30, what="the kubeconfig")
        result = subprocess.run([kubectl_path(), "--kubeconfig", str(kubeconfig), "get", "nodes",
                                 "-o", "name"], capture_output=True, text=True, check=True,
                                timeout=30)
        assert len(result.stdout.split()) == 7
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig),
                                           client_configuration=config)
        with kubernetes.client.ApiClient(config) as client:
            pods = wait_for(lambda: [p for p in kubernetes.client.CoreV1Api(client)
                                     .list_namespaced_pod("shop").items
                                     if p.spec.node_name], what="scheduled pods")
            assert pods
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert '"msg": "simulated cluster serving"' in stderr


def test_spotguard_sim_serve_rejects_a_missing_scenario(tmp_path: Path) -> None:
    """Bad input gets a clear error (exit 2), not a traceback."""
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "spotguard.cli", "sim", "serve", "--kubeconfig",
         str(tmp_path / "k"), "--scenario", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "scenario file not found" in result.stderr and "Traceback" not in result.stderr


def test_get_watch_prints_table_rows(kubectl: Kubectl, sim: testing.SimCluster) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables
    (kubectl get -w asks for Table watch events)"""
    import threading

    sim.store.create("namespaces", {"metadata": {"name": "watched"}})
    threading.Timer(0.8, lambda: sim.store.create(
        "configmaps", {"metadata": {"name": "appears"}}, namespace="watched")).start()
    result = kubectl("get", "configmaps", "-n", "watched", "-w", "--request-timeout=3s",
                     check=False)
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows and rows[0][0] == "NAME"
    assert any(r and r[0] == "appears" for r in rows), result.stdout


def test_rollout_status_of_a_statefulset_waits_for_the_rolling_update(
    kubectl: Kubectl, sim: testing.SimCluster,
) -> None:
    """https://kubernetes.io/docs/reference/kubectl/generated/kubectl_rollout/kubectl_rollout_status/
    (a StatefulSet is rolled out once currentRevision equals updateRevision)"""
    body = deployment_manifest("sts", replicas=2)
    body.update(kind="StatefulSet")
    body["spec"]["serviceName"] = "sts"
    sim.store.create("statefulsets", body, namespace="default")
    kubectl("rollout", "status", "statefulset/sts", "--timeout=30s")
    kubectl("set", "image", "statefulset/sts", "app=registry.k8s.io/pause:3.9")
    out = kubectl("rollout", "status", "statefulset/sts", "--timeout=30s").stdout
    assert "partitioned roll out complete" in out or "rolling update complete" in out, out
    pods, _ = sim.store.list("pods", "default", label_selector="app=sts")
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"registry.k8s.io/pause:3.9"}
