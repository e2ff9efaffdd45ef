"""The API contract for metadata-only responses (meta.k8s.io PartialObjectMetadata),
checked against the simulated cluster and (with SPOTGUARD_E2E_KUBECONFIG) a real one.

https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables
describes the Accept negotiation; client-go's metadata client (``metadata/metadata.go``)
and the Python dynamic client ask ``as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard_sim import testing

from tests.sim.conftest import Cluster

AS_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
AS_OBJECT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def call(cluster: Cluster, method: str, path: str, accept: str, *, body: Any = None,
         query: list[tuple[str, str]] | None = None, content_type: str = "application/json",
         accept_header: str = "Accept") -> tuple[int, Any]:
    try:
        resp = cluster.client.call_api(
            path, method, query_params=query or [], body=body,
            header_params={accept_header: accept, "Content-Type": content_type},
            auth_settings=["BearerToken"], _preload_content=False,
        )
        status, data = resp.status, resp.data
    except ApiException as exc:
        status, data = exc.status, exc.body
    return status, json.loads(data) if data else None


def configmaps(cluster: Cluster, count: int) -> list[str]:
    names = [f"cm-{i}" for i in range(count)]
    for name in names:
        cluster.core.create_namespaced_config_map(cluster.namespace, {
            "metadata": {"name": name, "labels": {"app": "meta"}, "annotations": {"note": name}},
            "data": {"secret-ish": "not in the answer"}})
    return names


def test_a_list_as_partial_object_metadata_list_carries_metadata_only(cluster: Cluster) -> None:
    names = configmaps(cluster, 3)
    path = f"/api/v1/namespaces/{cluster.namespace}/configmaps"
    status, full = call(cluster, "GET", path, "application/json", query=[("labelSelector", "app=meta")])
    assert status == 200
    status, listed = call(cluster, "GET", path, AS_LIST, query=[("labelSelector", "app=meta")])
    assert status == 200, listed
    assert (listed["kind"], listed["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
    assert listed["metadata"]["resourceVersion"]
    assert [i["metadata"]["name"] for i in listed["items"]] == names
    for item, obj in zip(listed["items"], full["items"], strict=True):
        assert set(item) == {"kind", "apiVersion", "metadata"}
        assert (item["kind"], item["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
        assert item["metadata"] == obj["metadata"]
    # paging keeps working: the continue token comes with the metadata-only page
    status, page = call(cluster, "GET", path, AS_LIST, query=[("labelSelector", "app=meta"), ("limit", "2")])
    assert status == 200 and len(page["items"]) == 2 and page["metadata"]["continue"]
    status, rest = call(cluster, "GET", path, AS_LIST, query=[("labelSelector", "app=meta"), ("limit", "2"),
                                                            ("continue", page["metadata"]["continue"])])
    assert status == 200 and [i["metadata"]["name"] for i in rest["items"]] == names[2:]
    # the header's name is case-insensitive, as the dynamic client's e2e test sends it
    status, listed = call(cluster, "GET", path, AS_LIST, accept_header="aCcePt")
    assert status == 200 and listed["kind"] == "PartialObjectMetadataList"


def test_a_get_as_partial_object_metadata_and_the_mismatches_are_406(cluster: Cluster) -> None:
    configmaps(cluster, 1)
    path = f"/api/v1/namespaces/{cluster.namespace}/configmaps"
    status, obj = call(cluster, "GET", f"{path}/cm-0", AS_OBJECT)
    assert status == 200, obj
    assert (obj["kind"], obj["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert "data" not in obj and obj["metadata"]["annotations"] == {"note": "cm-0"}
    status, err = call(cluster, "GET", f"{path}/cm-0", AS_LIST)
    assert (status, err["reason"]) == (406, "NotAcceptable")
    status, err = call(cluster, "GET", path, AS_OBJECT)
    assert (status, err["reason"]) == (406, "NotAcceptable")
    # a clause asking for a transform the server does not have is skipped ...
    status, obj = call(cluster, "GET", f"{path}/cm-0",
                       "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v9, application/json")
    assert status == 200 and obj["kind"] == "ConfigMap" and obj["data"]
    # ... and with no clause left the answer is 406
    status, err = call(cluster, "GET", f"{path}/cm-0", "application/json;as=Nothing;g=meta.k8s.io;v=v1")
    assert (status, err["reason"]) == (406, "NotAcceptable")


def test_a_watch_as_partial_object_metadata_sends_metadata_only(cluster: Cluster) -> None:
    path = f"/api/v1/namespaces/{cluster.namespace}/configmaps"
    status, listed = call(cluster, "GET", path, "application/json")
    assert status == 200
    configmaps(cluster, 1)
    resp = cluster.client.call_api(
        path, "GET", query_params=[("watch", "true"), ("timeoutSeconds", "60"),
                                   ("resourceVersion", listed["metadata"]["resourceVersion"])],
        header_params={"Accept": AS_OBJECT}, auth_settings=["BearerToken"], _preload_content=False,
    )
    try:
        event = json.loads(next(iter(resp)))
    finally:
        resp.close()
        resp.release_conn()
    assert event["type"] == "ADDED"
    obj = event["object"]
    assert (obj["kind"], obj["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert obj["metadata"]["name"] == "cm-0" and "data" not in obj


def test_server_side_apply_is_415_before_the_object_is_looked_up(sim_api: testing.SimCluster) -> None:
    """Not served (docs/sim.md): a missing object answers 415 too, not a misleading 404."""
    client = sim_api.api_client()
    try:
        cluster = Cluster("sim", sim_api.kubeconfig, client, "default", sim_api)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "applied"},
               "spec": {"containers": [{"name": "app", "image": "nginx"}]}}
        status, err = call(cluster, "PATCH", "/api/v1/namespaces/default/pods/applied", "application/json",
                           body=pod, content_type="application/apply-patch+yaml",
                           query=[("fieldManager", "test"), ("dryRun", "All")])
        assert (status, err["reason"]) == (415, "UnsupportedMediaType")
        assert "server-side apply" in err["message"]
        with pytest.raises(ApiException) as missing:
            kubernetes.client.CoreV1Api(client).read_namespaced_pod("applied", "default")
        assert missing.value.status == 404
    finally:
        client.close()


def test_events_k8s_io_events_are_served_as_metadata_too(cluster: Cluster) -> None:
    """events.k8s.io/v1 is served from core/v1 Events (docs/sim.md); metadata only works there too."""
    cluster.core.create_namespaced_event(cluster.namespace, {
        "metadata": {"name": "ev-0"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": cluster.namespace},
        "reason": "Tested", "message": "m", "type": "Normal"})
    path = f"/apis/events.k8s.io/v1/namespaces/{cluster.namespace}/events"
    status, obj = call(cluster, "GET", f"{path}/ev-0", AS_OBJECT)
    assert status == 200, obj
    assert (obj["kind"], obj["metadata"]["name"]) == ("PartialObjectMetadata", "ev-0") and "reason" not in obj
    status, listed = call(cluster, "GET", path, AS_LIST)
    assert status == 200 and listed["kind"] == "PartialObjectMetadataList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["ev-0"]
