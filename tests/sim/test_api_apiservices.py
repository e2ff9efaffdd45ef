"""apiregistration.k8s.io/v1 APIServices, as kube-apiserver's aggregator keeps them
(kubernetes/kube-aggregator at 232ca687: ``pkg/registry/apiservice``,
``pkg/apis/apiregistration/validation``, ``pkg/controllers/status``). The official
client's ``create_from_yaml`` e2e test creates one (``test_yaml/api-service.yaml``) and
expects the second create's 409 body byte for byte, the newline included.

The contract tests run against the simulated cluster and, with
``SPOTGUARD_E2E_KUBECONFIG``, a real one; the availability tests need the controllers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard_sim import testing

from tests.sim import controller_helpers as h
from tests.sim.conftest import Cluster


def apiservice(group: str, version: str = "v1alpha1", service: dict[str, Any] | None = None,
               **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                            "metadata": {"name": f"{version}.{group}"},
                            "spec": {"group": group, "version": version, "groupPriorityMinimum": 1000,
                                     "versionPriority": 15, **spec}}
    if service is not None:
        body["spec"]["service"] = service
        body["spec"].setdefault("insecureSkipTLSVerify", True)
    return body


def raw(client: kubernetes.client.ApiClient, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    try:
        resp = client.call_api(path, method, header_params={"Content-Type": "application/json",
                                                            "Accept": "application/json"},
                               body=body, auth_settings=["BearerToken"], _preload_content=False)
    except ApiException as exc:
        return exc.status, exc.body if isinstance(exc.body, bytes) else str(exc.body).encode()
    return resp.status, resp.data


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[kubernetes.client.ApiregistrationV1Api]:
    api = kubernetes.client.ApiregistrationV1Api(cluster.client)
    yield api
    for item in api.list_api_service().items:
        if item.metadata.name.endswith(".spotguard-test.example.com"):
            api.delete_api_service(item.metadata.name)


def test_an_apiservice_is_created_defaulted_and_409_on_the_second_create(
        cluster: Cluster, registry: kubernetes.client.ApiregistrationV1Api) -> None:
    body = apiservice("wardle.spotguard-test.example.com", service={"name": "api", "namespace": "wardle"})
    created = registry.create_api_service(body)
    assert created.spec.service.port == 443  # SetDefaults_ServiceReference
    assert created.spec.group == "wardle.spotguard-test.example.com"
    code, data = raw(cluster.client, "POST", "/apis/apiregistration.k8s.io/v1/apiservices", body)
    assert code == 409
    assert data == (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
                    b'"apiservices.apiregistration.k8s.io \\"v1alpha1.wardle.spotguard-test.example.com\\" '
                    b'already exists","reason":"AlreadyExists","details":{"name":'
                    b'"v1alpha1.wardle.spotguard-test.example.com","group":"apiregistration.k8s.io",'
                    b'"kind":"apiservices"},"code":409}\n')
    names = [a.metadata.name for a in registry.list_api_service().items]
    assert "v1alpha1.wardle.spotguard-test.example.com" in names


def test_a_local_apiservice_is_available_at_once(registry: kubernetes.client.ApiregistrationV1Api) -> None:
    created = registry.create_api_service(apiservice("local.spotguard-test.example.com"))
    [condition] = created.status.conditions
    assert (condition.type, condition.status, condition.reason, condition.message) == (
        "Available", "True", "Local", "Local APIServices are always available")


def test_the_status_sent_on_create_is_dropped(registry: kubernetes.client.ApiregistrationV1Api) -> None:
    body = apiservice("dropped.spotguard-test.example.com", service={"name": "api", "namespace": "default"})
    body["status"] = {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]}
    created = registry.create_api_service(body)
    assert not (created.status and created.status.conditions and any(
        c.reason == "Passed" for c in created.status.conditions))


def invalid(registry: kubernetes.client.ApiregistrationV1Api, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ApiException) as caught:
        registry.create_api_service(body)
    assert caught.value.status == 422
    status: dict[str, Any] = json.loads(caught.value.body)
    return status


def test_the_name_must_be_version_dot_group(registry: kubernetes.client.ApiregistrationV1Api) -> None:
    body = apiservice("named.spotguard-test.example.com")
    body["metadata"]["name"] = "other.spotguard-test.example.com"
    status = invalid(registry, body)
    assert status["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "metadata.name",
        "message": 'Invalid value: "other.spotguard-test.example.com": must be `spec.version+"."+spec.group`: '
                   '"v1alpha1.named.spotguard-test.example.com"'}]


def test_priorities_and_a_local_caBundle_are_refused(registry: kubernetes.client.ApiregistrationV1Api) -> None:
    body = apiservice("bad.spotguard-test.example.com", groupPriorityMinimum=0, versionPriority=1001,
                      insecureSkipTLSVerify=True)
    causes = invalid(registry, body)["details"]["causes"]
    assert [(c["field"], c["message"]) for c in causes] == [
        ("spec.groupPriorityMinimum", "Invalid value: 0: must be positive and less than 20000"),
        ("spec.versionPriority", "Invalid value: 1001: must be positive and less than 1000"),
        ("spec.insecureSkipTLSVerify", "Invalid value: true: local APIServices may not have insecureSkipTLSVerify"),
    ]


def test_a_service_reference_needs_its_namespace(registry: kubernetes.client.ApiregistrationV1Api) -> None:
    causes = invalid(registry, apiservice("svc.spotguard-test.example.com", service={"name": "api"}))[
        "details"]["causes"]
    assert causes == [{"reason": "FieldValueRequired", "message": "Required value",
                       "field": "spec.service.namespace"}]


def test_a_condition_status_must_be_true_false_or_unknown(
        registry: kubernetes.client.ApiregistrationV1Api) -> None:
    name = "v1alpha1.status.spotguard-test.example.com"
    registry.create_api_service(apiservice("status.spotguard-test.example.com"))
    with pytest.raises(ApiException) as caught:
        registry.patch_api_service_status(name, {"status": {"conditions": [
            {"type": "Available", "status": "Maybe", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    assert caught.value.status == 422
    assert json.loads(caught.value.body)["details"]["causes"] == [{
        "reason": "FieldValueNotSupported", "field": "status.conditions[0].status",
        "message": 'Unsupported value: "Maybe": supported values: "True", "False", "Unknown"'}]


@pytest.fixture(scope="module")
def running() -> Iterator[testing.SimCluster]:
    with testing.running_cluster(time_scale=10.0) as sim:
        yield sim


def available(api: kubernetes.client.ApiregistrationV1Api, name: str) -> tuple[str, str, str] | None:
    conditions = api.read_api_service(name).status.conditions or []
    return next(((c.status, c.reason, c.message) for c in conditions if c.type == "Available"), None)


def test_availability_follows_the_service(running: testing.SimCluster) -> None:
    """The remote availability controller: ServiceNotFound, then ServicePortError, then (no
    EndpointSlices are served, no aggregated server runs) EndpointsNotFound; never Available."""
    client = running.api_client()
    api = kubernetes.client.ApiregistrationV1Api(client)
    core = kubernetes.client.CoreV1Api(client)
    name = "v1alpha1.wardle.k8s.io"
    api.create_api_service(apiservice("wardle.k8s.io", service={"name": "api", "namespace": "default"}))
    h.wait_for(lambda: available(api, name) == (
        "False", "ServiceNotFound", 'service/api in "default" is not present'), what="ServiceNotFound")
    core.create_namespaced_service("default", {"metadata": {"name": "api"},
                                               "spec": {"ports": [{"port": 8443}], "selector": {"app": "api"}}})
    h.wait_for(lambda: available(api, name) == (
        "False", "ServicePortError", 'service/api in "default" is not listening on port 443'),
        what="ServicePortError")
    core.patch_namespaced_service("api", "default", {"spec": {"ports": [{"port": 443}]}})
    h.wait_for(lambda: available(api, name) == (
        "False", "EndpointsNotFound", 'cannot find endpointslices for service/api in "default"'),
        what="EndpointsNotFound")
    table = client.call_api("/apis/apiregistration.k8s.io/v1/apiservices/" + name, "GET",
                            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
                            auth_settings=["BearerToken"], _preload_content=False)
    row = json.loads(table.data)["rows"][0]["cells"]
    assert row[:3] == [name, "default/api", "False (EndpointsNotFound)"]
    api.delete_api_service(name)
