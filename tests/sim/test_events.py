"""Events the controllers and the scheduler record, as `kubectl describe` shows them.
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/"""

from __future__ import annotations

import kubernetes
from spotguard_sim import testing

from tests.sim import controller_helpers as h


def reasons(core: kubernetes.client.CoreV1Api, kind: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in core.list_namespaced_event("default").items:
        if e.involved_object.kind == kind:
            out.setdefault(e.reason, []).append(e.message)
    return out


def test_controllers_and_scheduler_record_events() -> None:
    with testing.running_cluster(time_scale=50.0) as sim:
        sim.store.create("nodes", h.node("n1", cpu="1"))
        core = kubernetes.client.CoreV1Api(sim.api_client())
        kubernetes.client.AppsV1Api(sim.api_client()).create_namespaced_deployment(
            "default", h.deployment("web", 3, cpu="400m"))
        h.wait_for(lambda: "ScalingReplicaSet" in reasons(core, "Deployment"), what="ScalingReplicaSet")
        h.wait_for(lambda: len(reasons(core, "ReplicaSet").get("SuccessfulCreate", [])) == 3, what="3 creates")
        pods = h.wait_for(lambda: reasons(core, "Pod"), what="pod events")
        h.wait_for(lambda: len(reasons(core, "Pod").get("Scheduled", [])) == 2, what="2 scheduled")
        failed = h.wait_for(lambda: reasons(core, "Pod").get("FailedScheduling"), what="FailedScheduling")
        assert failed[0] == "0/1 nodes are available: 1 Insufficient cpu."
        assert all(m.startswith("Successfully assigned default/web-") for m in reasons(core, "Pod")["Scheduled"])
        # kube-scheduler records through events.k8s.io/v1: no deprecated source, count or timestamps
        event = next(e for e in core.list_namespaced_event("default").items if e.reason == "Scheduled")
        assert event.reporting_component == "default-scheduler" and event.action == "Binding"
        assert event.reporting_instance.startswith("default-scheduler-") and event.event_time
        assert event.source.component is None and event.count is None and event.type == "Normal"
        v1 = kubernetes.client.EventsV1Api(sim.api_client())
        through_v1 = v1.read_namespaced_event(event.metadata.name, "default")
        assert through_v1.reporting_controller == "default-scheduler"
        assert through_v1.note.startswith("Successfully assigned default/web-")
        # the pending pod's repeated FailedScheduling becomes a series of count 2
        h.wait_for(lambda: any(e.series is not None and e.series.count == 2
                               for e in core.list_namespaced_event("default").items
                               if e.reason == "FailedScheduling"), what="a FailedScheduling series")
        assert pods
