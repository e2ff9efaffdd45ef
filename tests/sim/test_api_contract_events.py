"""The Event APIs: ``events.k8s.io/v1`` and core/v1 are two views of one storage.

Checked against the simulated cluster and (with SPOTGUARD_E2E_KUBECONFIG) a real one.
Sources: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/,
pkg/apis/events/v1/conversion.go (the field mapping) and
pkg/apis/core/validation/events.go (ValidateEventCreate / ValidateEventUpdate) of
kubernetes/kubernetes.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from tests.sim.conftest import Cluster
from tests.sim.test_api_contract import raw


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _new_event(ns: str, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": _now(), "type": "Normal", "reason": "Tested", "action": "Testing",
        "note": "written through events.k8s.io", "reportingController": "example.com/tester",
        "reportingInstance": "tester-1",
        "regarding": {"kind": "ConfigMap", "apiVersion": "v1", "name": "c", "namespace": ns},
        **extra,
    }


def _path(ns: str, name: str | None = None, *, group: bool = True) -> str:
    base = f"/apis/events.k8s.io/v1/namespaces/{ns}/events" if group else \
        f"/api/v1/namespaces/{ns}/events"
    return f"{base}/{name}" if name else base


def test_events_v1_is_in_discovery(cluster: Cluster) -> None:
    status, doc = raw(cluster, "GET", "/apis/events.k8s.io/v1")
    assert status == 200
    events = {r["name"]: r for r in doc["resources"]}["events"]
    assert events["namespaced"] and events["kind"] == "Event" and "ev" in events["shortNames"]
    status, groups = raw(cluster, "GET", "/apis")
    assert "events.k8s.io" in {g["name"] for g in groups["groups"]}


def test_an_event_written_through_events_v1_reads_through_core(cluster: Cluster) -> None:
    ns = cluster.namespace
    status, created = raw(cluster, "POST", _path(ns), _new_event(ns, "e1"))
    assert status == 201 and created["apiVersion"] == "events.k8s.io/v1"
    assert created["note"] == "written through events.k8s.io"
    core = cluster.core.read_namespaced_event("e1", ns)
    assert core.message == "written through events.k8s.io"
    assert core.reporting_component == "example.com/tester" and core.reporting_instance == "tester-1"
    assert core.involved_object.kind == "ConfigMap" and core.involved_object.name == "c"
    assert core.action == "Testing" and core.event_time is not None
    assert core.count is None and core.first_timestamp is None and core.source.component is None
    v1 = kubernetes.client.EventsV1Api(cluster.client)
    listed = v1.list_namespaced_event(ns, field_selector="regarding.name=c,reason=Tested")
    assert [e.metadata.name for e in listed.items] == ["e1"]
    assert listed.items[0].regarding.name == "c"


def test_a_core_event_reads_through_events_v1_with_deprecated_fields(cluster: Cluster) -> None:
    ns = cluster.namespace
    cluster.core.create_namespaced_event(ns, {
        "metadata": {"name": "legacy"}, "type": "Warning", "reason": "Old", "message": "legacy",
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
        "source": {"component": "kubelet", "host": "node-1"}, "count": 3,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:01:00Z"})
    status, event = raw(cluster, "GET", _path(ns, "legacy"))
    assert status == 200 and event["apiVersion"] == "events.k8s.io/v1"
    assert event["note"] == "legacy" and event["regarding"]["name"] == "p"
    assert event["deprecatedSource"] == {"component": "kubelet", "host": "node-1"}
    assert event["deprecatedCount"] == 3
    assert event["deprecatedFirstTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["deprecatedLastTimestamp"] == "2026-01-01T00:01:00Z"
    assert event["eventTime"] is None  # a MicroTime, serialised even when zero
    assert "message" not in event and "involvedObject" not in event and "count" not in event


@pytest.mark.parametrize(("change", "field"), [
    ({"eventTime": None}, "eventTime"),
    ({"reportingController": ""}, "reportingController"),
    ({"reportingController": "not a/qualified/name"}, "reportingController"),
    ({"reportingInstance": ""}, "reportingInstance"),
    ({"action": ""}, "action"),
    ({"type": "Odd"}, "type"),
    ({"deprecatedCount": 2}, "deprecatedCount"),
    ({"deprecatedSource": {"component": "x"}}, "deprecatedSource"),
    ({"note": "x" * 1025}, "note"),
    ({"series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}}, "series.count"),
])
def test_events_v1_create_is_validated_strictly(cluster: Cluster, change: dict[str, Any],
                                                field: str) -> None:
    ns = cluster.namespace
    status, body = raw(cluster, "POST", _path(ns), {**_new_event(ns, "bad"), **change})
    assert status == 422 and body["reason"] == "Invalid"
    assert field in {c["field"] for c in body["details"]["causes"]}


def test_events_v1_update_may_change_only_the_series(cluster: Cluster) -> None:
    ns = cluster.namespace
    raw(cluster, "POST", _path(ns), _new_event(ns, "s"))
    series = {"series": {"count": 2, "lastObservedTime": _now()}}
    status, patched = raw(cluster, "PATCH", _path(ns, "s"), series,
                          content_type="application/merge-patch+json")
    assert status == 200 and patched["series"]["count"] == 2
    assert cluster.core.read_namespaced_event("s", ns).series.count == 2
    status, body = raw(cluster, "PATCH", _path(ns, "s"), {"note": "changed"},
                       content_type="application/merge-patch+json")
    assert status == 422 and "note" in {c["field"] for c in body["details"]["causes"]}


def test_core_events_pass_the_legacy_validation(cluster: Cluster) -> None:
    ns = cluster.namespace
    with pytest.raises(ApiException) as info:  # the involved object's namespace must match
        cluster.core.create_namespaced_event(ns, {
            "metadata": {"name": "elsewhere"}, "reason": "R",
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "kube-system"}})
    assert info.value.status == 422
    with pytest.raises(ApiException) as new_style:  # with eventTime, the reporting fields
        cluster.core.create_namespaced_event(ns, {
            "metadata": {"name": "half"}, "reason": "R", "eventTime": _now(),
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns}})
    causes = {c["field"] for c in json.loads(new_style.value.body)["details"]["causes"]}
    assert {"reportingComponent", "reportingInstance", "action"} <= causes


def test_events_v1_watch_and_delete(cluster: Cluster) -> None:
    ns = cluster.namespace
    v1 = kubernetes.client.EventsV1Api(cluster.client)
    start = v1.list_namespaced_event(ns).metadata.resource_version
    cluster.core.create_namespaced_event(ns, {
        "metadata": {"name": "w"}, "reason": "R", "message": "through core", "eventTime": _now(),
        "action": "A", "reportingComponent": "example.com/c", "reportingInstance": "i",
        "type": "Normal", "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns}})
    seen = []
    for event in kubernetes.watch.Watch().stream(v1.list_namespaced_event, ns,
                                                 resource_version=start, timeout_seconds=5):
        seen.append((event["type"], event["object"].note, event["object"].reporting_controller))
        break
    assert seen == [("ADDED", "through core", "example.com/c")]
    v1.delete_namespaced_event("w", ns)
    with pytest.raises(ApiException) as info:
        cluster.core.read_namespaced_event("w", ns)
    assert info.value.status == 404
