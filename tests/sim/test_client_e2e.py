"""The official Python client's own end-to-end suite, against `spotguard sim serve`.

kubernetes-client/python keeps an e2e suite (``kubernetes/e2e_test/``:
``test_client.py``, ``test_apps.py``, ``test_batch.py``, ``test_watch.py``,
``test_informer.py``) that its maintainers run against a real cluster. It is not
shipped in the ``kubernetes`` wheel, so these are ports: the same API calls, in
the same order, with the same assertions, against a simulated cluster started
as a user starts it (``spotguard sim serve --kubeconfig``) and reached through
that kubeconfig. Left out, because no container runs: exec (``test_pod_apis``'s
exec part, ``test_exit_code``, ``test_pod_exec_close_channel``) and
port-forward (``test_portforward_raw``, ``test_portforward_http``). The files
themselves, at the pinned client's tag, also run unmodified
(``test_upstream_client_e2e.py``, vendored in ``kubernetes_client_e2e/``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes import watch
from kubernetes.client import ApiException
from kubernetes.informer import ADDED, DELETED, MODIFIED, SharedInformer

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


def short_uuid() -> str:
    return str(uuid.uuid4())[-12:]


def kubelet_node(name: str, zone: str) -> dict[str, Any]:
    """A node as its kubelet registers it (the nodeInfo fields the client requires)."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              "topology.kubernetes.io/zone": zone}},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{len(name)}"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "bootID": name, "containerRuntimeVersion": "containerd://2.1.4",
                         "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.35.0",
                         "machineID": name, "operatingSystem": "linux", "osImage": "Linux",
                         "systemUUID": name},
        },
    }


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubernetes.client.Configuration]:
    """`spotguard sim serve --kubeconfig` in a subprocess, as the suite's base.get_e2e_configuration
    would find a cluster: through a kubeconfig."""
    tmp = tmp_path_factory.mktemp("client-e2e")
    scenario = tmp / "nodes.yaml"
    scenario.write_text(yaml.safe_dump_all([kubelet_node(f"node-{i}", f"zone-{i}") for i in range(3)]))
    kubeconfig = tmp / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotguard.cli", "sim", "serve", "--kubeconfig", str(kubeconfig),
         "--scenario", str(scenario), "--time-scale", "10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "shared")},
    )
    try:
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "spotguard sim serve wrote no kubeconfig"
            time.sleep(0.1)
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        yield cfg
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def core(config: kubernetes.client.Configuration) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration=config))


# ---------------------------------------------------------------- test_client.py


def test_pod_apis_without_exec(config: kubernetes.client.Configuration) -> None:
    api = core(config)
    name = "busybox-test-" + short_uuid()
    deadline = time.monotonic() + TIMEOUT
    while True:  # wait for the default service account to be created
        try:
            assert api.read_namespaced_service_account(name="default", namespace="default").metadata.name == "default"
            break
        except ApiException as exc:
            assert exc.status == 404 and time.monotonic() < deadline
            time.sleep(0.2)
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"image": "busybox", "name": "sleep",
                                         "args": ["/bin/sh", "-c", "while true;do date;sleep 5; done"]}]}}
    resp = api.create_namespaced_pod(body=manifest, namespace="default")
    assert resp.metadata.name == name and resp.status.phase
    while True:
        resp = api.read_namespaced_pod(name=name, namespace="default")
        assert resp.metadata.name == name and resp.status.phase
        if resp.status.phase != "Pending":
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert len(api.list_pod_for_all_namespaces().items) > 0
    api.delete_namespaced_pod(name=name, body={}, namespace="default")


def test_service_apis(config: kubernetes.client.Configuration) -> None:
    api = core(config)
    name = "frontend-" + short_uuid()
    manifest = {"apiVersion": "v1", "kind": "Service", "metadata": {"labels": {"name": name}, "name": name},
                "spec": {"ports": [{"name": "port", "port": 80, "protocol": "TCP", "targetPort": 80}],
                         "selector": {"name": name}}}
    resp = api.create_namespaced_service(body=manifest, namespace="default")
    assert resp.metadata.name == name and resp.status
    resp = api.read_namespaced_service(name=name, namespace="default")
    assert resp.metadata.name == name and resp.status
    manifest["spec"]["ports"] = [{"name": "new", "port": 8080, "protocol": "TCP", "targetPort": 8080}]
    resp = api.patch_namespaced_service(body=manifest, name=name, namespace="default")
    assert len(resp.spec.ports) == 2 and resp.status
    api.delete_namespaced_service(name=name, body={}, namespace="default")


def test_replication_controller_apis(config: kubernetes.client.Configuration) -> None:
    api = core(config)
    name = "frontend-" + short_uuid()
    manifest = {"apiVersion": "v1", "kind": "ReplicationController",
                "metadata": {"labels": {"name": name}, "name": name},
                "spec": {"replicas": 2, "selector": {"name": name},
                         "template": {"metadata": {"labels": {"name": name}},
                                      "spec": {"containers": [{"image": "nginx", "name": "nginx",
                                                               "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}}
    resp = api.create_namespaced_replication_controller(body=manifest, namespace="default")
    assert resp.metadata.name == name and resp.spec.replicas == 2
    resp = api.read_namespaced_replication_controller(name=name, namespace="default")
    assert resp.metadata.name == name and resp.spec.replicas == 2
    api.delete_namespaced_replication_controller(name=name, namespace="default", propagation_policy="Background")


def test_configmap_apis(config: kubernetes.client.Configuration) -> None:
    api = core(config)
    name = "test-configmap-" + short_uuid()
    manifest = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name, "labels": {"e2e-tests": "true"}},
                "data": {"config.json": '{"command":"/usr/bin/mysqld_safe"}',
                         "frontend.cnf": "[mysqld]\nbind-address = 10.0.0.3\nport = 3306\n"}}
    assert api.create_namespaced_config_map(body=manifest, namespace="default").metadata.name == name
    assert api.read_namespaced_config_map(name=name, namespace="default").metadata.name == name
    resp = api.patch_namespaced_config_map(name=name, namespace="default", body=[
        {"op": "replace", "path": "/data", "value": {"new_value": "json_patch_name"}}])
    assert resp.data["new_value"] == "json_patch_name"
    assert resp.data.get("config.json") is None and resp.data.get("frontend.cnf") is None
    merge = {"data": {"new_value": "merge_patch_name"}}
    resp = api.patch_namespaced_config_map(name=name, namespace="default", body=merge)
    assert resp.data["new_value"] == "merge_patch_name"
    assert resp.data.get("config.json") is None and resp.data.get("frontend.cnf") is None
    api.delete_namespaced_config_map(name=name, body={}, namespace="default")
    assert api.list_namespaced_config_map("default", label_selector="e2e-tests=true").items == []


def test_node_apis(config: kubernetes.client.Configuration) -> None:
    api = core(config)
    items = api.list_node().items
    assert items  # the suite loops over the nodes; an empty cluster would check nothing
    for item in items:
        node = api.read_node(name=item.metadata.name)
        assert len(node.metadata.labels) > 0 and isinstance(node.metadata.labels, dict)


# ---------------------------------------------------------------- test_apps.py


def test_create_deployment(config: kubernetes.client.Configuration) -> None:
    api = kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(configuration=config))
    name = "nginx-deployment-" + str(uuid.uuid4())
    body = yaml.safe_load(f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: 3
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.15.4
        ports:
        - containerPort: 80
""")
    api.create_namespaced_deployment(body=body, namespace="default")
    resp = api.read_namespaced_deployment(name, "default")
    assert resp is not None and resp.metadata.name == name and resp.spec.replicas == 3
    assert resp.spec.selector.match_labels["app"] == "nginx"
    assert resp.spec.template.metadata.labels["app"] == "nginx"
    container = resp.spec.template.spec.containers[0]
    assert (container.name, container.image, container.ports[0].container_port) == ("nginx", "nginx:1.15.4", 80)
    api.delete_namespaced_deployment(name, "default", body=kubernetes.client.V1DeleteOptions())


def test_create_daemonset(config: kubernetes.client.Configuration) -> None:
    api = kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(configuration=config))
    name = "nginx-app-" + str(uuid.uuid4())
    body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"labels": {"app": "nginx"}, "name": name},
            "spec": {"selector": {"matchLabels": {"app": "nginx"}},
                     "template": {"metadata": {"labels": {"app": "nginx"}, "name": name},
                                  "spec": {"containers": [{"name": "nginx-app", "image": "nginx:1.15.4"}]}},
                     "updateStrategy": {"type": "RollingUpdate"}}}
    api.create_namespaced_daemon_set("default", body=body)
    resp = api.read_namespaced_daemon_set(name, "default")
    assert resp is not None and resp.metadata.name == name
    assert resp.spec.selector.match_labels["app"] == "nginx"
    assert resp.spec.template.metadata.labels["app"] == "nginx"
    assert (resp.spec.template.spec.containers[0].name, resp.spec.template.spec.containers[0].image) == (
        "nginx-app", "nginx:1.15.4")
    api.delete_namespaced_daemon_set(name, "default", body=kubernetes.client.V1DeleteOptions())


# ---------------------------------------------------------------- test_batch.py


def test_job_apis(config: kubernetes.client.Configuration) -> None:
    api = kubernetes.client.BatchV1Api(kubernetes.client.ApiClient(configuration=config))
    name = "test-job-" + str(uuid.uuid4())
    manifest = {"kind": "Job", "apiVersion": "batch/v1", "metadata": {"name": name},
                "spec": {"template": {"spec": {"containers": [{"image": "busybox", "name": name,
                                                               "command": ["sh", "-c", "sleep 5"]}],
                                               "restartPolicy": "Never"},
                                      "metadata": {"name": name}}}}
    assert api.create_namespaced_job(body=manifest, namespace="default").metadata.name == name
    assert api.read_namespaced_job(name=name, namespace="default").metadata.name == name
    api.delete_namespaced_job(name=name, namespace="default", propagation_policy="Background")


# ---------------------------------------------------------------- test_watch.py


def test_watch_configmaps(config: kubernetes.client.Configuration) -> None:
    api = core(config)

    def configmap(name: str, value: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                "data": {"key": value, "config": "dummy"}}

    name_a, name_b = "configmap-a-" + short_uuid(), "configmap-b-" + short_uuid()
    api.create_namespaced_config_map(body=configmap(name_a, "a"), namespace="default")
    rv = api.list_namespaced_config_map("default").metadata.resource_version
    b = configmap(name_b, "b")
    api.create_namespaced_config_map(body=b, namespace="default")
    b["data"]["config"] = "{}"
    api.patch_namespaced_config_map(name=name_b, namespace="default", body=b)
    api.delete_collection_namespaced_config_map(namespace="default")
    expect = ["ADDED", "MODIFIED", "DELETED", "DELETED"]
    i = 0
    for event in watch.Watch().stream(api.list_namespaced_config_map, namespace="default",
                                      resource_version=rv, timeout_seconds=5):
        assert event["type"] == expect[i]
        if i < 2:
            assert event["object"].metadata.name == name_b
        i += 1
    assert i == 4


# ---------------------------------------------------------------- test_informer.py


def _cm(name: str, payload: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"inf-e2e": "1"}},
            "data": payload or {"k": "v"}}


def _name_of(obj: Any) -> str:
    return str(obj.metadata.name if hasattr(obj, "metadata") else (obj.get("metadata") or {}).get("name"))


def _data(obj: Any) -> dict[str, str]:
    return dict(obj.data if hasattr(obj, "data") else (obj.get("data") or {}))


class _Informers:
    def __init__(self, config: kubernetes.client.Configuration) -> None:
        self.api = core(config)
        self.started: list[SharedInformer] = []

    def start(self, **kwargs: Any) -> SharedInformer:
        inf = SharedInformer(list_func=self.api.list_namespaced_config_map, namespace="default",
                             label_selector="inf-e2e=1", **kwargs)
        self.handlers(inf)
        inf.start()
        self.started.append(inf)
        return inf

    def handlers(self, inf: SharedInformer) -> None:
        pass

    def wait_in_cache(self, inf: SharedInformer, key: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while inf.cache.get_by_key(key) is None:
            assert time.monotonic() < deadline, f"{key} never appeared in the cache"
            time.sleep(0.25)

    def wait_listed(self, inf: SharedInformer) -> None:
        deadline = time.monotonic() + TIMEOUT
        while inf._resource_version is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert inf._resource_version is not None, "initial list never completed"

    def drop(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.api.delete_namespaced_config_map(name=name, namespace="default")


@pytest.fixture
def informers(config: kubernetes.client.Configuration) -> Iterator[_Informers]:
    helper = _Informers(config)
    yield helper
    for inf in helper.started:
        inf.stop()


def _on(inf: SharedInformer, kind: str, name: str) -> threading.Event:
    seen = threading.Event()
    inf.add_event_handler(kind, lambda o: seen.set() if _name_of(o) == name else None)
    return seen


def test_informer_cache_populated_after_start(informers: _Informers) -> None:
    name = "inf-pre-" + short_uuid()
    informers.api.create_namespaced_config_map(body=_cm(name), namespace="default")
    try:
        inf = informers.start()
        informers.wait_in_cache(inf, "default/" + name)
        cached = inf.cache.get_by_key("default/" + name)
        assert _name_of(cached) == name and _data(cached).get("k") == "v"
    finally:
        informers.drop(name)


def test_informer_added_modified_deleted(informers: _Informers) -> None:
    name = "inf-add-" + short_uuid()
    inf = SharedInformer(list_func=informers.api.list_namespaced_config_map, namespace="default",
                         label_selector="inf-e2e=1")
    added, modified, deleted = _on(inf, ADDED, name), _on(inf, MODIFIED, name), _on(inf, DELETED, name)
    inf.start()
    informers.started.append(inf)
    informers.wait_listed(inf)
    rv_before = int(inf._resource_version)
    informers.api.create_namespaced_config_map(body=_cm(name), namespace="default")
    assert added.wait(TIMEOUT), "ADDED"
    assert inf.cache.get_by_key("default/" + name) is not None
    assert int(inf._resource_version) > rv_before
    informers.api.patch_namespaced_config_map(name=name, namespace="default", body={"data": {"k": "updated"}})
    assert modified.wait(TIMEOUT), "MODIFIED"
    assert _data(inf.cache.get_by_key("default/" + name)).get("k") == "updated"
    informers.api.delete_namespaced_config_map(name=name, namespace="default")
    assert deleted.wait(TIMEOUT), "DELETED"
    assert inf.cache.get_by_key("default/" + name) is None


def test_informer_resync_fires_modified_for_existing_objects(informers: _Informers) -> None:
    name = "inf-rsync-" + short_uuid()
    informers.api.create_namespaced_config_map(body=_cm(name), namespace="default")
    try:
        inf = SharedInformer(list_func=informers.api.list_namespaced_config_map, namespace="default",
                             label_selector="inf-e2e=1", resync_period=5)
        added, resynced = _on(inf, ADDED, name), _on(inf, MODIFIED, name)
        inf.start()
        informers.started.append(inf)
        assert added.wait(TIMEOUT), "ADDED"
        assert resynced.wait(15), "resync MODIFIED"
        assert _data(inf.cache.get_by_key("default/" + name)).get("k") == "v"
    finally:
        informers.drop(name)
