"""The simulated API server calls mutating admission webhooks as kube-apiserver does:
https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/

A real HTTPS webhook server runs in the test (its own certificate, given to the
configuration as caBundle); pods are created through the official client.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException
from spotguard_sim import testing, tls

from tests.sim.conftest import deployment_manifest, pod_manifest

Review = dict[str, Any]
Behaviour = Callable[[Review], dict[str, Any]]


def allow(patch: list[dict[str, Any]] | None = None) -> Behaviour:
    def answer(review: Review) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return response
    return answer


def add_label(key: str, value: str) -> Behaviour:
    def answer(review: Review) -> dict[str, Any]:
        labels = review["request"]["object"]["metadata"].get("labels")
        if labels is None:
            ops = [{"op": "add", "path": "/metadata/labels", "value": {key: value}}]
        elif labels.get(key) == value:
            ops = []
        else:
            ops = [{"op": "add", "path": f"/metadata/labels/{key.replace('/', '~1')}",
                    "value": value}]
        return allow(ops)(review)
    return answer


def deny(message: str) -> Behaviour:
    def answer(review: Review) -> dict[str, Any]:
        return {"uid": review["request"]["uid"], "allowed": False,
                "status": {"code": 403, "message": message}}
    return answer


def slow(seconds: float) -> Behaviour:
    def answer(review: Review) -> dict[str, Any]:
        time.sleep(seconds)
        return allow()(review)
    return answer


class Webhook:
    """An HTTPS admission webhook server: behaviours by path, every review recorded."""

    def __init__(self) -> None:
        self.cert = tls.self_signed(("127.0.0.1",))
        self.behaviours: dict[str, Behaviour] = {}
        self.reviews: dict[str, list[Review]] = {}
        self.queries: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = testing.read_review(self)
                # Routed by path, as a webhook server is; kube-apiserver adds ?timeout=<n>s.
                url = urllib.parse.urlsplit(self.path)
                with outer.lock:
                    outer.queries.append(url.query)
                    outer.reviews.setdefault(url.path, []).append(body)
                    behaviour = outer.behaviours.get(url.path, allow())
                response = behaviour(body)
                testing.answer_review(self, response)

        self.server, self.base_url, self.ca_bundle = tls.serve_https(Handler, self.cert)

    def url(self, path: str) -> str:
        return self.base_url + path

    def calls(self, path: str) -> list[Review]:
        with self.lock:
            return list(self.reviews.get(path, []))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sim() -> Iterator[testing.SimCluster]:
    with testing.running_cluster(controllers=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    server = Webhook()
    yield server
    server.stop()


@pytest.fixture
def admission(sim: testing.SimCluster) -> Iterator[kubernetes.client.AdmissionregistrationV1Api]:
    api = kubernetes.client.AdmissionregistrationV1Api(sim.api_client())
    yield api
    for config in api.list_mutating_webhook_configuration().items:
        api.delete_mutating_webhook_configuration(config.metadata.name)


@pytest.fixture
def core(sim: testing.SimCluster) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(sim.api_client())


def hook(webhook: Webhook, name: str, path: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "clientConfig": {"url": webhook.url(path), "caBundle": webhook.ca_bundle},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                   "resources": ["pods"]}],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 5,
    }
    out.update(extra)
    return out


def configure(api: kubernetes.client.AdmissionregistrationV1Api, name: str,
              *hooks: dict[str, Any]) -> None:
    api.create_mutating_webhook_configuration(
        {"metadata": {"name": name}, "webhooks": list(hooks)})


def test_review_is_sent_as_kube_apiserver_sends_it_and_the_patch_applies(
    sim: testing.SimCluster, webhook: Webhook, admission: Any,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#request
    (empty name for generateName, the caller's userInfo, oldObject null, CreateOptions)"""
    webhook.behaviours["/review"] = add_label("spotguard.io/placement", "spot")
    configure(admission, "review", hook(webhook, "review.example.com", "/review"))
    as_controller = kubernetes.client.CoreV1Api(
        sim.api_client(impersonate="system:serviceaccount:kube-system:replicaset-controller"))
    pod = as_controller.create_namespaced_pod("default", pod_manifest(generate_name="web-"))
    assert pod.metadata.labels == {"spotguard.io/placement": "spot"}
    review = webhook.calls("/review")[-1]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    req = review["request"]
    assert req["uid"]
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert req["requestKind"] == req["kind"] and req["requestResource"] == req["resource"]
    assert req["name"] == "" and req["namespace"] == "default"
    assert req["operation"] == "CREATE"
    assert req["userInfo"]["username"] == "system:serviceaccount:kube-system:replicaset-controller"
    assert "system:serviceaccounts" in req["userInfo"]["groups"]
    assert req["oldObject"] is None and req["dryRun"] is False
    assert req["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert req["object"]["metadata"]["generateName"] == "web-"
    assert "name" not in req["object"]["metadata"]


def test_rules_select_the_resource(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                                   admission: Any) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-rules"""
    configure(admission, "rules", hook(webhook, "rules.example.com", "/rules"))
    core.create_namespaced_config_map("default", {"metadata": {"generateName": "cm-"}})
    assert webhook.calls("/rules") == []
    core.create_namespaced_pod("default", pod_manifest(generate_name="p-"))
    assert len(webhook.calls("/rules")) == 1


def test_a_denial_rejects_the_pod(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                                  admission: Any) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#response"""
    webhook.behaviours["/deny"] = deny("pods are not welcome")
    configure(admission, "deny", hook(webhook, "deny.example.com", "/deny"))
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", pod_manifest("denied"))
    assert info.value.status == 403
    assert ('admission webhook "deny.example.com" denied the request: pods are not welcome'
            in json.loads(info.value.body)["message"])
    with pytest.raises(ApiException):
        core.read_namespaced_pod("denied", "default")


@pytest.mark.parametrize(("policy", "created"), [("Ignore", True), ("Fail", False)])
def test_failure_policy_when_the_webhook_is_unreachable(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any, policy: str,
    created: bool, *, caplog: pytest.LogCaptureFixture,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#failure-policy"""
    broken = hook(webhook, "down.example.com", "/down", failurePolicy=policy)
    broken["clientConfig"]["url"] = "https://127.0.0.1:1/down"
    configure(admission, "down", broken)
    name = f"down-{policy.lower()}"
    if created:
        assert core.create_namespaced_pod("default", pod_manifest(name)).metadata.name == name
        # and the API server's log says which webhook failed and why, in its message
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("webhook call failed")]
        assert "down.example.com: " in line and "127.0.0.1" in line
    else:
        with pytest.raises(ApiException) as info:
            core.create_namespaced_pod("default", pod_manifest(name))
        assert info.value.status == 500
        assert 'failed calling webhook "down.example.com"' in json.loads(info.value.body)["message"]


@pytest.mark.parametrize(("policy", "created"), [("Ignore", True), ("Fail", False)])
def test_timeout_seconds_bounds_the_call(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any, policy: str,
    created: bool,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#timeouts"""
    webhook.behaviours["/slow"] = slow(2.0)
    configure(admission, "slow", hook(webhook, "slow.example.com", "/slow",
                                      failurePolicy=policy, timeoutSeconds=1))
    started = time.monotonic()
    name = f"slow-{policy.lower()}"
    if created:
        core.create_namespaced_pod("default", pod_manifest(name))
    else:
        with pytest.raises(ApiException) as info:
            core.create_namespaced_pod("default", pod_manifest(name))
        assert info.value.status == 500
    assert time.monotonic() - started < 1.8
    assert "timeout=1s" in webhook.queries  # kube-apiserver tells the webhook its timeout


def test_a_wrong_ca_bundle_fails_tls_verification(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#service-reference
    (caBundle: the PEM bundle used to verify the webhook's serving certificate)"""
    other = base64.b64encode(tls.self_signed(("127.0.0.1",)).cert_pem).decode()
    bad = hook(webhook, "badca.example.com", "/badca")
    bad["clientConfig"]["caBundle"] = other
    configure(admission, "badca", bad)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", pod_manifest("bad-ca"))
    assert info.value.status == 500
    assert "certificate" in json.loads(info.value.body)["message"].lower()
    assert webhook.calls("/badca") == []


def test_service_references_are_refused_clearly(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#service-reference
    The simulated cluster has no service network: clientConfig.service is a clear error."""
    svc = hook(webhook, "svc.example.com", "/svc")
    svc["clientConfig"] = {"service": {"namespace": "x", "name": "y", "path": "/svc"},
                           "caBundle": webhook.ca_bundle}
    configure(admission, "svc", svc)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", pod_manifest("svc-ref"))
    assert "clientConfig.service is not supported" in json.loads(info.value.body)["message"]


def test_namespace_selector(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                            admission: Any) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-namespaceselector"""
    core.create_namespace({"metadata": {"name": "ns-on", "labels": {"spotguard": "on"}}})
    core.create_namespace({"metadata": {"name": "ns-off"}})
    configure(admission, "nssel", hook(
        webhook, "ns.example.com", "/ns",
        namespaceSelector={"matchExpressions": [{"key": "spotguard", "operator": "In",
                                                 "values": ["on"]}]}))
    core.create_namespaced_pod("ns-off", pod_manifest("p"))
    assert webhook.calls("/ns") == []
    core.create_namespaced_pod("ns-on", pod_manifest("p"))
    assert [c["request"]["namespace"] for c in webhook.calls("/ns")] == ["ns-on"]


def test_object_selector(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                         admission: Any) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-objectselector"""
    configure(admission, "objsel", hook(webhook, "obj.example.com", "/obj",
                                        objectSelector={"matchLabels": {"managed": "yes"}}))
    core.create_namespaced_pod("default", pod_manifest("plain"))
    core.create_namespaced_pod("default", pod_manifest("managed", labels={"managed": "yes"}))
    assert [c["request"]["object"]["metadata"]["name"] for c in webhook.calls("/obj")] == ["managed"]


@pytest.mark.parametrize(("policy", "calls"), [("IfNeeded", 2), ("Never", 1)])
def test_reinvocation_policy(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                             admission: Any, policy: str, calls: int) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#reinvocation-policy"""
    first, second = f"/first-{policy}", f"/second-{policy}"
    webhook.behaviours[second] = add_label("added-by", "second")
    configure(admission, f"reinvoke-{policy.lower()}",
              hook(webhook, "first.example.com", first, reinvocationPolicy=policy),
              hook(webhook, "second.example.com", second))
    pod = core.create_namespaced_pod("default", pod_manifest(f"re-{policy.lower()}"))
    assert pod.metadata.labels == {"added-by": "second"}
    seen = webhook.calls(first)
    assert len(seen) == calls
    if calls == 2:
        assert seen[1]["request"]["object"]["metadata"]["labels"] == {"added-by": "second"}
    assert len(webhook.calls(second)) == 1


def test_dry_run_is_sent_and_side_effect_webhooks_refuse_it(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#side-effects"""
    configure(admission, "dry", hook(webhook, "dry.example.com", "/dry", sideEffects="None"))
    core.create_namespaced_pod("default", pod_manifest("dry"), dry_run="All")
    assert webhook.calls("/dry")[-1]["request"]["dryRun"] is True
    with pytest.raises(ApiException):
        core.read_namespaced_pod("dry", "default")
    admission.delete_mutating_webhook_configuration("dry")
    # admissionregistration.k8s.io/v1 accepts only None and NoneOnDryRun: a webhook with side
    # effects cannot be registered at all (the v1beta1 values Some and Unknown are refused)
    with pytest.raises(ApiException) as info:
        configure(admission, "effects", hook(webhook, "fx.example.com", "/fx", sideEffects="Some"))
    assert info.value.status == 422 and "sideEffects" in info.value.body


def test_concurrent_creates_all_go_through_the_webhook(
    sim: testing.SimCluster, webhook: Webhook, admission: Any,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#webhook-request-and-response
    Many pods created at once (as a ReplicaSet does) are each admitted."""
    webhook.behaviours["/many"] = add_label("admitted", "yes")
    configure(admission, "many", hook(webhook, "many.example.com", "/many"))
    core = kubernetes.client.CoreV1Api(sim.api_client())
    core.create_namespace({"metadata": {"name": "many"}})
    count = 60
    started = time.monotonic()
    with futures.ThreadPoolExecutor(12) as pool:
        pods = list(pool.map(lambda i: core.create_namespaced_pod(
            "many", pod_manifest(generate_name="m-")), range(count)))
    elapsed = time.monotonic() - started
    assert all(p.metadata.labels == {"admitted": "yes"} for p in pods)
    assert len(webhook.calls("/many")) == count
    assert count / elapsed > 30, f"only {count / elapsed:.0f} admitted creates a second"


def test_a_deployment_of_50_gets_every_pod_through_the_webhook_and_the_scheduler(
    webhook: Webhook,
) -> None:
    """The ReplicaSet controller's concurrent creates each pass the webhook (with the
    controller's userInfo), then the scheduler binds them:
    https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/"""
    webhook.behaviours["/fifty"] = add_label("spotguard.io/placement", "spot")
    nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"},
              "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}
             for i in range(3)]
    with testing.running_cluster(nodes, time_scale=10.0) as cluster:
        api = kubernetes.client.AdmissionregistrationV1Api(cluster.api_client())
        configure(api, "fifty", hook(webhook, "fifty.example.com", "/fifty"))
        apps = kubernetes.client.AppsV1Api(cluster.api_client())
        apps.create_namespaced_deployment("default", {
            "metadata": {"name": "fifty"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "fifty"}},
                     "template": {"metadata": {"labels": {"app": "fifty"}},
                                  "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}},
        })
        apps.patch_namespaced_deployment_scale("fifty", "default", {"spec": {"replicas": 50}})
        deadline = time.monotonic() + 30
        while True:
            pods, _ = cluster.store.list("pods", "default", "app=fifty")
            if len(pods) == 50 and all(p["spec"].get("nodeName") for p in pods):
                break
            assert time.monotonic() < deadline, f"{len(pods)} pods after 30s"
            time.sleep(0.1)
        assert all(p["metadata"]["labels"].get("spotguard.io/placement") == "spot" for p in pods)
        users = {c["request"]["userInfo"]["username"] for c in webhook.calls("/fifty")}
        assert users == {"system:serviceaccount:kube-system:replicaset-controller"}
        assert len(webhook.calls("/fifty")) >= 50


MATCH_OWNED = {
    "name": "controlled-by-replicaset-or-statefulset",
    "expression": "has(object.metadata.ownerReferences) && "
                  "object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller && "
                  "(r.kind == 'ReplicaSet' || r.kind == 'StatefulSet'))",
}


def test_match_conditions_filter_calls(core: kubernetes.client.CoreV1Api, webhook: Webhook,
                                       admission: Any) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-matchconditions"""
    configure(admission, "cel", hook(webhook, "cel.example.com", "/cel",
                                     matchConditions=[MATCH_OWNED]))
    core.create_namespaced_pod("default", pod_manifest("bare"))
    assert webhook.calls("/cel") == []
    owned = pod_manifest("owned")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                             "name": "rs", "uid": "u-1", "controller": True}]
    core.create_namespaced_pod("default", owned)
    assert [c["request"]["object"]["metadata"]["name"] for c in webhook.calls("/cel")] == ["owned"]


@pytest.mark.parametrize(("policy", "created"), [("Ignore", True), ("Fail", False)])
def test_match_condition_errors_follow_the_failure_policy(
    core: kubernetes.client.CoreV1Api, webhook: Webhook, admission: Any, policy: str,
    created: bool,
) -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-matchconditions
    (an evaluation error: Fail rejects the request, Ignore skips the webhook)"""
    path = f"/celerr-{policy}"
    configure(admission, f"celerr-{policy.lower()}", hook(
        webhook, "celerr.example.com", path, failurePolicy=policy,
        matchConditions=[{"name": "missing", "expression": "object.spec.nothing == 'x'"}]))
    name = f"celerr-{policy.lower()}"
    if created:
        core.create_namespaced_pod("default", pod_manifest(name))
    else:
        with pytest.raises(ApiException) as info:
            core.create_namespaced_pod("default", pod_manifest(name))
        assert "matchCondition 'missing'" in json.loads(info.value.body)["message"]
    assert webhook.calls(path) == []


def test_update_status_subresource_and_delete_rules_fire(
    sim: testing.SimCluster, webhook: Webhook, admission: Any, core: kubernetes.client.CoreV1Api,
) -> None:
    """Rules name operations and resources as kube-apiserver matches them: UPDATE of `pods`
    (not its subresources), `pods/status`, `pods/eviction` (a CREATE), DELETE; the review
    carries oldObject, UpdateOptions / DeleteOptions and subResource
    (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#matching-requests-rules)."""
    def rule(operations: list[str], resources: list[str]) -> list[dict[str, Any]]:
        return [{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources}]

    webhook.behaviours["/upd"] = add_label("updated-by", "webhook")
    configure(admission, "ops",
              hook(webhook, "upd.example.com", "/upd", rules=rule(["UPDATE"], ["pods"])),
              hook(webhook, "st.example.com", "/st", rules=rule(["UPDATE"], ["pods/status"])),
              hook(webhook, "ev.example.com", "/ev", rules=rule(["CREATE"], ["pods/eviction"])),
              hook(webhook, "del.example.com", "/del", rules=rule(["DELETE"], ["pods"])))
    core.create_namespaced_pod("default", pod_manifest("ops", labels={"app": "ops"}))
    assert webhook.calls("/upd") == []  # a CREATE: no UPDATE rule fires
    patched = core.patch_namespaced_pod("ops", "default", {"metadata": {"labels": {"tier": "x"}}})
    assert patched.metadata.labels["updated-by"] == "webhook"  # the mutation is stored
    request = webhook.calls("/upd")[-1]["request"]
    assert request["operation"] == "UPDATE" and request["options"]["kind"] == "UpdateOptions"
    assert request["oldObject"]["metadata"]["labels"] == {"app": "ops"}
    assert request["object"]["metadata"]["labels"]["tier"] == "x"
    assert "subResource" not in request and webhook.calls("/st") == []
    core.patch_namespaced_pod_status("ops", "default", {"status": {"message": "hello"}})
    status_request = webhook.calls("/st")[-1]["request"]
    assert status_request["subResource"] == "status" and status_request["operation"] == "UPDATE"
    with contextlib.suppress(ApiException):
        core.create_namespaced_pod_eviction("ops", "default", {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ops"}})
    eviction = webhook.calls("/ev")[-1]["request"]
    assert (eviction["subResource"], eviction["kind"]["kind"], eviction["operation"]) == (
        "eviction", "Eviction", "CREATE")
    if webhook.calls("/del"):  # the eviction deleted the pod: a DELETE of pods
        assert webhook.calls("/del")[-1]["request"]["oldObject"]["metadata"]["name"] == "ops"
    else:
        core.delete_namespaced_pod("ops", "default")
    deletion = webhook.calls("/del")[-1]["request"]
    assert deletion["operation"] == "DELETE" and deletion["object"] is None
    assert deletion["options"]["kind"] == "DeleteOptions"


def test_scale_subresource_rules_see_the_scale(
    sim: testing.SimCluster, webhook: Webhook, admission: Any,
) -> None:
    """An update of deployments/scale is reviewed with the autoscaling/v1 Scale by rules naming
    `deployments/scale`; rules naming `deployments` do not fire for it."""
    def rule(resources: list[str]) -> list[dict[str, Any]]:
        return [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": resources}]

    configure(admission, "scale",
              hook(webhook, "scale.example.com", "/scale", rules=rule(["deployments/scale"])),
              hook(webhook, "dep.example.com", "/dep", rules=rule(["deployments"])))
    apps = kubernetes.client.AppsV1Api(sim.api_client())
    apps.create_namespaced_deployment("default", deployment_manifest("scaled", replicas=1))
    apps.patch_namespaced_deployment_scale("scaled", "default", {"spec": {"replicas": 4}})
    request = webhook.calls("/scale")[-1]["request"]
    assert (request["subResource"], request["kind"]["kind"], request["object"]["spec"]["replicas"]) == (
        "scale", "Scale", 4)
    assert request["oldObject"]["spec"]["replicas"] == 1
    assert webhook.calls("/dep") == []
    assert apps.read_namespaced_deployment("scaled", "default").spec.replicas == 4
