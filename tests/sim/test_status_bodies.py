"""The error bodies the simulated API server sends, byte for byte the ``metav1.Status``
objects kube-apiserver sends for the same request (issue 26: "Status bodies exactly as
upstream's").

Sources, read at kubernetes/apimachinery eed236ceee2c19c2753a3d93ac0631dc20750454 and
kubernetes/apiserver 24a394e516bfda066d7e2221d7d92c052de27c54:

* ``apimachinery pkg/api/errors/errors.go``: NewNotFound, NewAlreadyExists, NewConflict,
  NewInvalid, NewForbidden, NewTooManyRequests, NewTimeoutError, NewResourceExpired,
  NewGenericServerResponse (``details`` is set, so sent as ``{}`` even when empty; its
  ``kind`` is the plural resource, its ``group`` omitted for the core group);
* ``apimachinery pkg/apis/meta/v1/types.go``: Status, StatusDetails, StatusCause (all
  fields ``omitempty``; ``metadata`` a struct, so always ``{}``);
* ``apimachinery pkg/util/validation/field/errors.go``: a 422's message aggregates its
  causes, ``[a, b]`` when more than one;
* ``apiserver pkg/endpoints/handlers/responsewriters/errors.go``: the RBAC 403 message;
* ``apiserver pkg/server/handler.go``: go-restful's 404 and 405 go through
  NewGenericServerResponse;
* ``apiserver pkg/storage/errors.go``: NewTooLargeResourceVersionError;
* ``kubernetes pkg/registry/core/pod/storage/eviction.go`` (01aa0f3f6052): the eviction 429s
  and 403s.

The tests run against the simulated cluster and, with ``SPOTGUARD_E2E_KUBECONFIG``, a real
one (those that set a status a real cluster's controllers would overwrite are sim-only).
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard_sim import settings, testing

from tests.sim import controller_helpers as h
from tests.sim.conftest import Cluster, deployment_manifest, pod_manifest

SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def failure(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Status as Go's encoding/json writes it: field order of metav1.Status."""
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason}
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def call(cluster: Cluster, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None, **query: str) -> tuple[int, dict[str, Any], Any]:
    """One raw request through the official client; (status, decoded body, headers)."""
    header_params = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    try:
        resp = cluster.client.call_api(path, method, query_params=list(query.items()), header_params=header_params,
                                       body=body, auth_settings=["BearerToken"], _preload_content=False)
    except ApiException as exc:
        return exc.status, json.loads(exc.body), exc.headers
    return resp.status, json.loads(resp.data), resp.headers


def assert_body(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got == want
    assert list(got) == list(want)  # the key order Go writes too


def ns_path(cluster: Cluster, rest: str, group: str = "") -> str:
    prefix = f"/apis/{group}/v1" if group else "/api/v1"
    return f"{prefix}/namespaces/{cluster.namespace}/{rest}"


# ---------------------------------------------------------------- 404


def test_get_a_missing_pod_is_upstreams_404(cluster: Cluster) -> None:
    code, body, _ = call(cluster, "GET", ns_path(cluster, "pods/nope"))
    assert code == 404
    assert_body(body, failure(404, "NotFound", 'pods "nope" not found', {"name": "nope", "kind": "pods"}))


def raw_body(cluster: Cluster, path: str) -> bytes:
    try:
        resp = cluster.client.call_api(path, "GET", header_params={"Accept": "application/json"},
                                       auth_settings=["BearerToken"], _preload_content=False)
    except ApiException as exc:
        return exc.body if isinstance(exc.body, bytes) else str(exc.body).encode()
    data: bytes = resp.data
    return data


def test_bodies_end_as_encoding_json_encoder_ends_them(cluster: Cluster) -> None:
    """An API object's JSON ends with a newline, as encoding/json's Encoder.Encode writes it
    (apimachinery runtime/serializer/json doEncode; streamed lists end ``}\\n`` too): the
    official client's FailToCreateError carries the Status body, newline included."""
    missing = raw_body(cluster, ns_path(cluster, "pods/nope"))
    assert missing == (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
                       b'"pods \\"nope\\" not found","reason":"NotFound","details":{"name":"nope","kind":'
                       b'"pods"},"code":404}\n')
    cluster.core.create_namespaced_config_map(cluster.namespace, {"metadata": {"name": "nl"}})
    for path in (ns_path(cluster, "configmaps/nl"), ns_path(cluster, "configmaps"), "/api", "/apis",
                 "/api/v1"):
        body = raw_body(cluster, path)
        assert body.endswith(b"}\n") and not body.endswith(b"\n\n"), (path, body[-40:])
    assert not raw_body(cluster, "/version").endswith(b"\n")  # WriteRawJSON


def test_get_a_missing_deployment_names_its_group(cluster: Cluster) -> None:
    code, body, _ = call(cluster, "GET", ns_path(cluster, "deployments/nope", "apps"))
    assert code == 404
    assert_body(body, failure(404, "NotFound", 'deployments.apps "nope" not found',
                              {"name": "nope", "group": "apps", "kind": "deployments"}))


def test_an_unknown_resource_is_go_restfuls_generic_404(cluster: Cluster) -> None:
    code, body, _ = call(cluster, "GET", ns_path(cluster, "nopes"))
    assert code == 404
    assert_body(body, failure(404, "NotFound", "the server could not find the requested resource", {}))


# ---------------------------------------------------------------- 409


def test_create_twice_is_409_already_exists(cluster: Cluster) -> None:
    assert call(cluster, "POST", ns_path(cluster, "pods"), pod_manifest("twice"))[0] == 201
    code, body, _ = call(cluster, "POST", ns_path(cluster, "pods"), pod_manifest("twice"))
    assert code == 409
    assert_body(body, failure(409, "AlreadyExists", 'pods "twice" already exists',
                              {"name": "twice", "kind": "pods"}))


def test_a_stale_update_is_409_conflict_with_group_and_resource(cluster: Cluster) -> None:
    path = ns_path(cluster, "deployments", "apps")
    code, created, _ = call(cluster, "POST", path, deployment_manifest("web"))
    assert code == 201
    fresh = call(cluster, "GET", f"{path}/web")[1]
    fresh["metadata"].setdefault("labels", {})["touched"] = "yes"
    assert call(cluster, "PUT", f"{path}/web", fresh)[0] == 200
    code, body, _ = call(cluster, "PUT", f"{path}/web", created)  # the first resourceVersion
    assert code == 409
    assert_body(body, failure(
        409, "Conflict", 'Operation cannot be fulfilled on deployments.apps "web": the object has been '
        "modified; please apply your changes to the latest version and try again",
        {"name": "web", "group": "apps", "kind": "deployments"}))


def test_a_delete_precondition_is_before_deletes_409(cluster: Cluster) -> None:
    """rest.BeforeDelete (apiserver pkg/registry/rest/delete.go) checks the preconditions
    first, naming the object by its kind."""
    path = ns_path(cluster, "configmaps")
    code, created, _ = call(cluster, "POST", path, {"metadata": {"name": "cfg"}})
    assert code == 201
    uid = created["metadata"]["uid"]
    code, body, _ = call(cluster, "DELETE", f"{path}/cfg", {"preconditions": {"uid": "not-it"}})
    assert code == 409
    assert_body(body, failure(
        409, "Conflict", 'Operation cannot be fulfilled on ConfigMap "cfg": the UID in the precondition '
        f"(not-it) does not match the UID in record ({uid}). The object might have been deleted and then "
        "recreated", {"name": "cfg", "kind": "ConfigMap"}))


# ---------------------------------------------------------------- 422


def test_an_invalid_pod_is_422_with_every_cause(cluster: Cluster) -> None:
    pod = pod_manifest("Bad_Name")
    pod["spec"]["containers"] = []
    code, body, _ = call(cluster, "POST", ns_path(cluster, "pods"), pod)
    assert code == 422
    invalid_name = f'Invalid value: "Bad_Name": {SUBDOMAIN_RULE}'
    assert_body(body, failure(
        422, "Invalid", f'Pod "Bad_Name" is invalid: [metadata.name: {invalid_name}, spec.containers: Required value]',
        {"name": "Bad_Name", "kind": "Pod", "causes": [
            {"reason": "FieldValueInvalid", "message": invalid_name, "field": "metadata.name"},
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"},
        ]}))


def test_one_cause_is_not_bracketed(cluster: Cluster) -> None:
    code, body, _ = call(cluster, "POST", ns_path(cluster, "configmaps"), {"metadata": {"name": "Not_Valid"}})
    assert code == 422
    invalid_name = f'Invalid value: "Not_Valid": {SUBDOMAIN_RULE}'
    assert_body(body, failure(
        422, "Invalid", f'ConfigMap "Not_Valid" is invalid: metadata.name: {invalid_name}',
        {"name": "Not_Valid", "kind": "ConfigMap", "causes": [
            {"reason": "FieldValueInvalid", "message": invalid_name, "field": "metadata.name"}]}))


# ---------------------------------------------------------------- 403


def test_rbac_403_as_responsewriters_forbidden_writes_it(cluster: Cluster) -> None:
    user = f"system:serviceaccount:{cluster.namespace}:nobody"
    as_nobody = {"Impersonate-User": user}
    code, body, _ = call(cluster, "GET", ns_path(cluster, "pods/p"), headers=as_nobody)
    assert code == 403
    assert_body(body, failure(
        403, "Forbidden", f'pods "p" is forbidden: User "{user}" cannot get resource "pods" in API group "" '
        f'in the namespace "{cluster.namespace}"', {"name": "p", "kind": "pods"}))
    code, body, _ = call(cluster, "GET", "/apis/apps/v1/deployments", headers=as_nobody)
    assert code == 403
    assert_body(body, failure(
        403, "Forbidden", f'deployments.apps is forbidden: User "{user}" cannot list resource "deployments" in '
        'API group "apps" at the cluster scope', {"group": "apps", "kind": "deployments"}))
    code, body, _ = call(cluster, "GET", "/metrics", headers=as_nobody)
    assert code == 403
    assert_body(body, failure(403, "Forbidden", f'forbidden: User "{user}" cannot get path "/metrics"', {}))


# ---------------------------------------------------------------- eviction: 429, 403


def _ready_pod_and_budget(cluster: Cluster, status: dict[str, Any] | None) -> None:
    assert cluster.sim is not None
    store = cluster.sim.store
    call(cluster, "POST", ns_path(cluster, "pods"), pod_manifest("guarded", labels={"app": "guarded"}))
    store.mutate("pods", "guarded", cluster.namespace, lambda p: p.update(status={
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}))
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "budget"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}
    assert call(cluster, "POST", ns_path(cluster, "poddisruptionbudgets", "policy"), budget)[0] == 201
    if status is not None:
        store.mutate("poddisruptionbudgets", "budget", cluster.namespace, lambda b: b.update(status=status))


def _evict(cluster: Cluster) -> tuple[int, dict[str, Any], Any]:
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "guarded", "namespace": cluster.namespace}}
    return call(cluster, "POST", ns_path(cluster, "pods/guarded/eviction"), eviction)


def test_an_eviction_a_budget_blocks_is_429_with_its_cause(sim_cluster: Cluster) -> None:
    # sim only: sets the pod's and the budget's status, which a real cluster's controllers own
    cluster = sim_cluster
    _ready_pod_and_budget(cluster, {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1,
                                    "desiredHealthy": 1, "expectedPods": 1})
    code, body, headers = _evict(cluster)
    assert code == 429
    assert "Retry-After" not in headers  # NewTooManyRequests(..., 0)
    assert_body(body, failure(
        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget",
                     "message": "The disruption budget budget needs 1 healthy pods and has 1 currently"}]}))


def test_an_eviction_before_the_budget_is_observed_is_429_retry_after_10(sim_cluster: Cluster) -> None:
    # sim only: needs a budget no disruption controller has observed
    cluster = sim_cluster
    _ready_pod_and_budget(cluster, None)
    code, body, headers = _evict(cluster)
    assert code == 429
    assert headers["Retry-After"] == "10"
    assert_body(body, failure(
        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget",
                     "message": "The disruption budget budget is still being processed by the server."}],
         "retryAfterSeconds": 10}))


def test_an_eviction_against_a_negative_budget_is_403(sim_cluster: Cluster) -> None:
    # sim only: sets the budget's status, which a real cluster's disruption controller owns
    cluster = sim_cluster
    _ready_pod_and_budget(cluster, {"observedGeneration": 1, "disruptionsAllowed": -1})
    code, body, _ = _evict(cluster)
    assert code == 403
    assert_body(body, failure(
        403, "Forbidden", 'poddisruptionbudget.policy "budget" is forbidden: pdb disruptions allowed is negative',
        {"name": "budget", "group": "policy", "kind": "poddisruptionbudget"}))


# ---------------------------------------------------------------- 405


def test_a_method_a_route_lacks_is_go_restfuls_generic_405(cluster: Cluster) -> None:
    assert call(cluster, "POST", ns_path(cluster, "pods"), pod_manifest("p405"))[0] == 201
    want = failure(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})
    for method, rest, body in (("GET", "pods/p405/eviction", None), ("PUT", "pods", pod_manifest("p405")),
                               ("POST", "pods/p405", pod_manifest("p405"))):
        code, got, _ = call(cluster, method, ns_path(cluster, rest), body)
        assert code == 405, (method, rest)
        assert_body(got, want)


# ---------------------------------------------------------------- 504, 410


def test_a_list_at_a_future_resource_version_is_504_too_large(cluster: Cluster) -> None:
    current = int(call(cluster, "GET", ns_path(cluster, "configmaps"))[1]["metadata"]["resourceVersion"])
    future = current + 1_000_000
    code, body, headers = call(cluster, "GET", ns_path(cluster, "configmaps"), resourceVersion=str(future),
                               resourceVersionMatch="NotOlderThan")
    assert code == 504
    assert headers["Retry-After"] == "1"
    now = body["message"].rsplit(" ", 1)[-1]  # the revision the server was at
    assert int(now) >= current
    assert_body(body, failure(
        504, "Timeout", f"Timeout: Too large resource version: {future}, current: {now}",
        {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
         "retryAfterSeconds": 1}))


def test_a_compacted_resource_version_is_410_expired() -> None:
    fast = settings.Settings(api_server=settings.ApiServer(etcd_compaction_interval=2.0))
    with testing.running_cluster(time_scale=10, settings=fast, controllers=False) as sim:
        api = sim.api_client()
        core = kubernetes.client.CoreV1Api(api)
        old = int(core.list_namespaced_config_map("default").metadata.resource_version)
        written = [0]

        def compacted() -> bool:
            written[0] += 1
            core.create_namespaced_config_map("default", {"metadata": {"name": f"tick-{written[0]}"}})
            return sim.store.compacted_revision() > old + 1

        h.wait_for(compacted, what=f"compaction past {old}")
        with pytest.raises(ApiException) as exact:
            core.list_namespaced_config_map("default", resource_version=str(old), resource_version_match="Exact")
        assert exact.value.status == 410
        assert_body(json.loads(exact.value.body),
                    failure(410, "Expired", "The resourceVersion for the provided list is too old."))
        resp = api.call_api("/api/v1/namespaces/default/configmaps", "GET",
                            query_params=[("watch", "true"), ("resourceVersion", str(old))],
                            auth_settings=["BearerToken"], _preload_content=False)
        events = [json.loads(line) for line in resp.data.splitlines() if line.strip()]
        assert [e["type"] for e in events] == ["ERROR"]
        message = events[0]["object"]["message"]
        assert message.startswith(f"too old resource version: {old} (")
        assert_body(events[0]["object"], failure(410, "Expired", message))
