"""GIVEN a scripted API server, WHEN the gateway calls it, THEN the wire is what kube-apiserver expects.

Paths follow the Kubernetes API concepts (https://kubernetes.io/docs/reference/using-api/api-concepts/):
``/api/v1/namespaces/{ns}/pods/{name}``, ``/apis/{group}/{version}/...``; lists are paged
with ``limit`` and ``continue``; patches carry their content type.
"""

from __future__ import annotations

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r

from tests.gateway.fakeapi import Answer, FakeApi, Request, api_client, status


def pod(name: str, ns: str = "shop", rv: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


def test_get_builds_core_and_group_paths(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/namespaces/shop/pods/web-1", Answer(body=pod("web-1")))
    api.on("GET", "/apis/apps/v1/namespaces/shop/deployments/web", Answer(body={"kind": "Deployment"}))
    api.on("GET", "/api/v1/nodes/n1", Answer(body={"kind": "Node"}))
    api.on("GET", "/apis/coordination.k8s.io/v1/namespaces/shop/leases/l", Answer(body={"kind": "Lease"}))

    assert k.get(r.PODS, "web-1", "shop")["metadata"]["name"] == "web-1"
    assert k.get(r.DEPLOYMENTS, "web", "shop")["kind"] == "Deployment"
    assert k.get(r.NODES, "n1")["kind"] == "Node"
    assert k.get(r.LEASES, "l", "shop")["kind"] == "Lease"
    assert all(req.headers["accept"] == "application/json" for req in api.requests)


def test_find_returns_none_when_missing(api: FakeApi, k: kube.Kube) -> None:
    api.on("GET", "/api/v1/namespaces/shop/pods/gone", status(404, "NotFound", 'pods "gone" not found'))
    assert k.find(r.PODS, "gone", "shop") is None


def test_namespaced_resource_needs_a_namespace(k: kube.Kube) -> None:
    with pytest.raises(ValueError, match="namespaced"):
        k.get(r.PODS, "x")
    with pytest.raises(ValueError, match="cluster-scoped"):
        r.NODES.path("shop", "n1")


def test_list_follows_continue_with_a_page_limit(api: FakeApi) -> None:
    pages = {
        "": ({"resourceVersion": "42", "continue": "t1"}, [pod("a"), pod("b")]),
        "t1": ({"resourceVersion": "42", "continue": "t2"}, [pod("c"), pod("d")]),
        "t2": ({"resourceVersion": "42"}, [{"metadata": {"name": "e"}}]),
    }

    def paged(req: Request) -> Answer:
        meta, items = pages[req.query.get("continue", "")]
        return Answer(body={"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})

    api.on("GET", "/api/v1/namespaces/shop/pods", paged)
    k = kube.Kube(api_client(api.url), page_limit=2)

    items, version = k.list_with_version(r.PODS, "shop", label_selector="app=web", field_selector="spec.nodeName=n1")

    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c", "d", "e"]
    assert version == "42"
    assert items[-1]["kind"] == "Pod" and items[-1]["apiVersion"] == "v1"  # filled in for list items
    assert [req.query.get("continue") for req in api.requests] == [None, "t1", "t2"]
    assert {req.query["limit"] for req in api.requests} == {"2"}
    assert {req.query["labelSelector"] for req in api.requests} == {"app=web"}
    assert {req.query["fieldSelector"] for req in api.requests} == {"spec.nodeName=n1"}
    assert k.stats.by_verb == {"list": 3}


def test_list_across_namespaces_and_expired_continue_restarts(api: FakeApi, k: kube.Kube) -> None:
    answers = iter(
        [
            Answer(body={"metadata": {"resourceVersion": "5", "continue": "old"}, "items": [pod("a")]}),
            status(410, "Expired", "The provided continue parameter is too old"),
            Answer(body={"metadata": {"resourceVersion": "9"}, "items": [pod("a"), pod("b")]}),
        ]
    )
    api.on("GET", "/api/v1/pods", lambda req: next(answers))
    items, version = k.list_with_version(r.PODS)
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert version == "9"
    # the re-list is one unpaged request (client-go's pager: FullListIfExpired)
    assert "limit" not in api.requests[-1].query and "continue" not in api.requests[-1].query


def test_create_posts_to_the_collection_with_dry_run(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/shop/configmaps", lambda req: Answer(201, req.body))
    made = k.create(r.CONFIGMAPS, {"metadata": {"name": "c"}, "data": {"a": "1"}}, "shop", dry_run=True)
    req = api.requests[-1]
    assert req.query == {"dryRun": "All"}
    assert req.body["apiVersion"] == "v1" and req.body["kind"] == "ConfigMap"  # filled in
    assert made["data"] == {"a": "1"}
    assert k.stats.writes == 1


def test_create_takes_the_namespace_from_the_object(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/apis/policy/v1/namespaces/shop/poddisruptionbudgets", lambda req: Answer(201, req.body))
    k.create(r.PODDISRUPTIONBUDGETS, {"metadata": {"name": "b", "namespace": "shop"}, "spec": {}})
    assert api.requests[-1].body["apiVersion"] == "policy/v1"


@pytest.mark.parametrize(
    ("patch_type", "body", "content_type"),
    [
        ("merge", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"),
        ("json", [{"op": "add", "path": "/metadata/labels/a", "value": "b"}], "application/json-patch+json"),
        (
            "strategic",
            {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
            "application/strategic-merge-patch+json",
        ),
    ],
)
def test_patch_sets_the_content_type(
    api: FakeApi, k: kube.Kube, patch_type: str, body: object, content_type: str
) -> None:
    api.on("PATCH", "/api/v1/nodes/n1", Answer(body={"kind": "Node"}))
    k.patch(r.NODES, "n1", body, patch_type=patch_type)  # type: ignore[arg-type]
    req = api.requests[-1]
    assert req.content_type == content_type
    assert req.body == body


def test_patch_rejects_a_mismatched_body(k: kube.Kube) -> None:
    with pytest.raises(ValueError, match="JSON patch"):
        k.patch(r.NODES, "n1", {"a": 1}, patch_type="json")
    with pytest.raises(ValueError, match="patch_type"):
        k.patch(r.NODES, "n1", {"a": 1}, patch_type="apply")


def test_replace_puts_the_object_with_its_resource_version(api: FakeApi, k: kube.Kube) -> None:
    api.on("PUT", "/apis/coordination.k8s.io/v1/namespaces/shop/leases/web", lambda req: Answer(body=req.body))
    lease = {"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7"}, "spec": {}}
    k.replace(r.LEASES, lease)
    req = api.requests[-1]
    assert req.body["metadata"]["resourceVersion"] == "7"
    assert req.content_type == "application/json"
    assert k.stats.by_verb == {"update": 1}


def test_update_status_puts_the_status_subresource(api: FakeApi, k: kube.Kube) -> None:
    api.on("PUT", "/apis/policy/v1/namespaces/shop/poddisruptionbudgets/b/status", lambda req: Answer(body=req.body))
    k.update_status(r.PODDISRUPTIONBUDGETS, {"metadata": {"name": "b", "namespace": "shop"}, "status": {}})
    assert api.count("PUT", ".*/b/status") == 1
    assert k.stats.by_resource == {"poddisruptionbudgets.policy/status": 1}


def test_scale_reads_and_patches_the_scale_subresource(api: FakeApi, k: kube.Kube) -> None:
    scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 3}, "status": {"replicas": 3}}
    api.on("GET", "/apis/apps/v1/namespaces/shop/deployments/web/scale", Answer(body=scale))
    api.on("PATCH", "/apis/apps/v1/namespaces/shop/deployments/web/scale", lambda req: Answer(body=req.body))
    assert k.scale(r.DEPLOYMENTS, "web", "shop")["spec"]["replicas"] == 3
    k.set_scale(r.DEPLOYMENTS, "web", "shop", 5)
    req = api.requests[-1]
    assert req.body == {"spec": {"replicas": 5}}
    assert req.content_type == "application/merge-patch+json"


def test_delete_sends_delete_options(api: FakeApi, k: kube.Kube) -> None:
    api.on(
        "DELETE",
        "/apis/policy/v1/namespaces/shop/poddisruptionbudgets/b",
        Answer(body={"kind": "Status", "status": "Success"}),
    )
    k.delete(r.PODDISRUPTIONBUDGETS, "b", "shop", propagation_policy="Background", resource_version="9", uid="u1")
    body = api.requests[-1].body
    assert body["kind"] == "DeleteOptions"
    assert body["propagationPolicy"] == "Background"
    assert body["preconditions"] == {"resourceVersion": "9", "uid": "u1"}


def test_evict_posts_a_policy_v1_eviction(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/shop/pods/web-1/eviction", Answer(201, {"kind": "Status", "status": "Success"}))
    k.evict("web-1", "shop")
    body = api.requests[-1].body
    assert body == {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-1", "namespace": "shop"}}
    assert k.stats.count("create", "pods/eviction") == 1


def test_create_event_writes_a_core_v1_event(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/shop/events", lambda req: Answer(201, req.body))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "3"},
    }
    event = k.create_event(
        deployment, "InvalidAnnotation", "min-on-demand 'x' is not a number", "Warning", "spotguard-admission"
    )
    assert event is not None
    assert event["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "web",
        "namespace": "shop",
        "uid": "u-1",
        "resourceVersion": "3",
    }
    assert event["metadata"]["name"].startswith("web.")
    assert event["metadata"]["namespace"] == "shop"
    assert event["type"] == "Warning"
    assert event["reason"] == "InvalidAnnotation"
    assert event["source"]["component"] == "spotguard-admission"
    assert event["reportingComponent"] == "spotguard-admission"
    assert event["reportingInstance"]
    assert event["action"] == "InvalidAnnotation"
    assert event["count"] == 1
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["firstTimestamp"].endswith("Z") and len(event["firstTimestamp"]) == 20
    assert event["eventTime"].endswith("Z") and "." in event["eventTime"]


def test_event_about_a_node_goes_to_the_default_namespace(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/default/events", lambda req: Answer(201, req.body))
    event = k.create_event({"kind": "Node", "name": "n1", "apiVersion": "v1"}, "Tainted", "spot notice")
    assert event is not None and event["involvedObject"]["name"] == "n1"


def test_best_effort_event_swallows_errors(api: FakeApi, k: kube.Kube) -> None:
    api.on("POST", "/api/v1/namespaces/shop/events", status(403, "Forbidden", "events is forbidden"))
    ref = {"kind": "Pod", "name": "p", "namespace": "shop"}
    assert k.create_event(ref, "R", "m", best_effort=True) is None
    with pytest.raises(kube.Forbidden):
        k.create_event(ref, "R", "m")


def test_for_kind_maps_owner_references() -> None:
    assert r.for_kind("apps/v1", "ReplicaSet") is r.REPLICASETS
    assert r.for_kind("v1", "Pod") is r.PODS
    assert r.for_kind("batch/v1", "Job") is None
