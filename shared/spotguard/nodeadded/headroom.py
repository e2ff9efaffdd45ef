"""node-added keeps the on-demand headroom: a Deployment of low-priority placeholder pods.

Each pass sizes the headroom from the snapshot it read (:func:`spotguard.policy.headroom.
wanted`) and keeps the Deployment ``spotguard-headroom`` in spotguard's namespace at that
size: created when it is wanted and absent, patched (guarded by the resourceVersion read)
only when the wanted size or pod template changed, scaled to 0 while nothing is at risk,
deleted when the headroom is turned off. A pass that finds it as wanted writes nothing.

Its pods run the pause image with the PriorityClass ``spotguard-headroom`` (value -10,
``preemptionPolicy: Never``, shipped as a static manifest: node-added creates no cluster-wide
object), pinned to on-demand nodes by the admission webhook's own on-demand requirement
("not spot under any scheme"), with no tolerations (spotguard adds none to on-demand floor
pods either). They carry no ``karpenter.sh/do-not-disrupt``: the node autoscaler may move or
consolidate them like any pod. The Deployment is marked ``spotguard.io/enabled: "false"``,
so no plan of spotguard's (floors, surges, moves, the eviction guard) takes it for a workload,
whatever the excluded namespaces say.

A write that fails leaves the pass working: it is logged, counted
(``spotguard_nodeadded_errors_total{step="headroom"}``) and tried again next pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources as r
from spotguard.gateway.errors import ApiError, Conflict, NotFound
from spotguard.nodeadded import metrics
from spotguard.policy import headroom, patches
from spotguard.policy.config import Config
from spotguard.policy.headroom import Headroom
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import PodView
from spotguard.policy.workloads import ENABLED, Kind

log = logging.getLogger("spotguard.nodeadded")

Obj = dict[str, Any]
RECORD = "spotguard.io/headroom"  # on the Deployment: what spotguard last wrote (JSON)
MANAGED_BY = "app.kubernetes.io/managed-by"


class Step(enum.StrEnum):
    UNCHANGED = "unchanged"
    CREATED = "created"
    RESIZED = "resized"
    DELETED = "deleted"
    FOREIGN = "foreign"  # a Deployment of that name that spotguard did not make: left alone
    FAILED = "failed"
    PLANNED = "planned"  # dry run: a write was wanted


def key(namespace: str) -> str:
    return f"{Kind.DEPLOYMENT}/{namespace}/{headroom.NAME}"


def with_requests(states: Iterable[WorkloadState], raw_pods: Sequence[Obj], nodes: set[str]) -> list[WorkloadState]:
    """The states with the full views (requests included) of their pods on ``nodes``: a pass's
    light views carry no requests, and only the pods at risk need them."""
    full = {
        str((p.get("metadata") or {}).get("uid", "")): PodView.from_json(p)
        for p in raw_pods
        if (p.get("spec") or {}).get("nodeName") in nodes
    }
    return [dataclasses.replace(s, pods=tuple(full.get(p.uid, p) for p in s.pods)) for s in states]


def template(want: Headroom, config: Config) -> Obj:
    """The placeholders' pod template."""
    requests: dict[str, str] = {}
    if want.cpu:
        requests[headroom.CPU] = f"{want.cpu}m"
    if want.memory:
        requests[headroom.MEMORY] = str(want.memory)
    labels = {headroom.LABEL: "true", "app.kubernetes.io/name": headroom.NAME, MANAGED_BY: "spotguard"}
    terms = [{"matchExpressions": expressions} for expressions in patches.on_demand_terms(config)]
    return {
        "metadata": {"labels": labels},
        "spec": {
            "priorityClassName": headroom.PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "affinity": {"nodeAffinity": {patches.REQUIRED: {"nodeSelectorTerms": terms}}},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "pause",
                    "image": config.headroom_image,
                    "resources": {"requests": requests, "limits": dict(requests)},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def priority_class() -> Obj:
    """The placeholders' PriorityClass as shipped (infra/kubernetes/common/priorityclass-headroom.yaml,
    the Helm chart's templates/priorityclass.yaml); for clusters spotguard sets up itself (the demo)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": headroom.PRIORITY_CLASS},
        "value": headroom.PRIORITY,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "spotguard's on-demand headroom placeholders: preempted by any pod that needs their room.",
    }


def record(want: Headroom, pod_template: Mapping[str, Any]) -> str:
    """What spotguard writes on the Deployment: the size and a fingerprint of the template."""
    digest = hashlib.sha256(json.dumps(pod_template, sort_keys=True).encode()).hexdigest()[:16]
    out = {"cover": str(want.cover), "count": want.count, "cpu": want.cpu, "memory": want.memory, "template": digest}
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def deployment(want: Headroom, config: Config, namespace: str) -> Obj:
    pod_template = template(want, config)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": headroom.NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": headroom.NAME, MANAGED_BY: "spotguard"},
            "annotations": {ENABLED: "false", RECORD: record(want, pod_template)},
        },
        "spec": {
            "replicas": want.count,
            "selector": {"matchLabels": {headroom.LABEL: "true"}},
            # A new size replaces the placeholders rather than adding a second set beside them.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 1,
            "template": pod_template,
        },
    }


class Keeper:
    """Keeps the headroom Deployment at the wanted size (one write at most per pass)."""

    def __init__(self, kube: kube_mod.Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def keep(self, want: Headroom, current: Obj | None, config: Config, *, dry_run: bool = False) -> Step:
        wanted_obj = deployment(want, config, self.namespace)
        step = self._step(want, current, wanted_obj)
        kept = 0 if step is Step.FOREIGN else _replicas(current)  # placeholders of ours now
        if step in (Step.UNCHANGED, Step.FOREIGN) or dry_run:
            self._gauges(want, kept)
            if step is Step.FOREIGN:
                log.warning(
                    "a Deployment named spotguard-headroom that spotguard did not make: left alone",
                    extra={"deployment": key(self.namespace)},
                )
            return Step.PLANNED if dry_run and step not in (Step.UNCHANGED, Step.FOREIGN) else step
        try:
            written = self._write(step, want, current, wanted_obj)
        except Conflict:
            log.info("the headroom changed since it was read: next pass", extra={"deployment": key(self.namespace)})
            self._gauges(want, kept)
            return Step.UNCHANGED
        except ApiError as exc:
            metrics.ERRORS.labels("headroom").inc()
            metrics.HEADROOM_WRITES.labels(str(step), "failed").inc()
            log.warning(
                "could not keep the headroom: next pass",
                extra={"deployment": key(self.namespace), "step": str(step), "error": str(exc)},
            )
            self._gauges(want, kept)
            return Step.FAILED
        metrics.HEADROOM_WRITES.labels(str(step), "done").inc()
        self._gauges(want, 0 if step is Step.DELETED else want.count)
        log.info(
            "headroom " + str(step),
            extra={
                "deployment": key(self.namespace),
                "cover": str(want.cover),
                "placeholders": want.count,
                "wanted": want.wanted,
                "cpu_millicores": want.cpu,
                "memory_bytes": want.memory,
                "pods_at_risk": want.pods,
                "nodes": list(want.nodes),
                "capped": want.capped,
            },
        )
        if written is not None:
            self.kube.create_event(written, "SpotguardHeadroom", want.describe(), best_effort=True)
        return step

    def _step(self, want: Headroom, current: Obj | None, wanted_obj: Obj) -> Step:
        if current is None:
            return Step.CREATED if want.count > 0 else Step.UNCHANGED
        meta = current.get("metadata") or {}
        if (meta.get("labels") or {}).get(MANAGED_BY) != "spotguard":
            return Step.FOREIGN
        if want.cover is headroom.Cover.OFF:
            return Step.DELETED
        if want.count == 0:
            # Nothing at risk: scaled to 0, its template kept for when something is again.
            return Step.UNCHANGED if _replicas(current) == 0 else Step.RESIZED
        same = (meta.get("annotations") or {}).get(RECORD) == wanted_obj["metadata"]["annotations"][RECORD]
        return Step.UNCHANGED if same and _replicas(current) == want.count else Step.RESIZED

    def _write(self, step: Step, want: Headroom, current: Obj | None, wanted_obj: Obj) -> Obj | None:
        if step is Step.CREATED:
            return self.kube.create(r.DEPLOYMENTS, wanted_obj, self.namespace)
        assert current is not None
        meta = current.get("metadata") or {}
        if step is Step.DELETED:
            uid = str(meta.get("uid") or "") or None
            with contextlib.suppress(NotFound):
                self.kube.delete(r.DEPLOYMENTS, headroom.NAME, self.namespace, uid=uid, propagation_policy="Background")
            return None
        if want.count == 0:
            body0: Obj = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": {"replicas": 0}}
            return self.kube.patch(r.DEPLOYMENTS, headroom.NAME, body0, self.namespace)
        # A merge patch (guarded by the resourceVersion read: 409 when stale) merges maps, so a
        # request no longer wanted is written as null (removed), not left out (kept).
        pod_template = json.loads(json.dumps(wanted_obj["spec"]["template"]))
        for part in ("requests", "limits"):
            held = pod_template["spec"]["containers"][0]["resources"][part]
            for name in (headroom.CPU, headroom.MEMORY):
                held.setdefault(name, None)
        body: Obj = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": wanted_obj["metadata"]["annotations"],
            },
            "spec": {"replicas": want.count, "template": pod_template},
        }
        return self.kube.patch(r.DEPLOYMENTS, headroom.NAME, body, self.namespace)

    def unplaced(self, pods: Iterable[PodView], now: float) -> int:
        """Says so when placeholders have had no room for long (:func:`headroom.unplaced`): the
        headroom holds nothing then, and a surge waits for a launch as without it."""
        count = headroom.unplaced(pods, self.namespace, now)
        metrics.HEADROOM.labels("unplaced").set(count)
        if count:
            log.warning(
                "headroom placeholders unscheduled for over %d s: the node autoscaler launches nothing for them "
                "(a Cluster Autoscaler ignores pods below --expendable-pods-priority-cutoff: it must be -10 or lower "
                "for the placeholders' priority -10), or on-demand capacity is refused or at its limit; the "
                "headroom holds nothing until they run",
                int(headroom.UNPLACED_SECONDS),
                extra={"deployment": key(self.namespace), "placeholders": count},
            )
        return count

    @staticmethod
    def _gauges(want: Headroom, kept: int) -> None:
        metrics.HEADROOM.labels("wanted").set(want.count)
        metrics.HEADROOM.labels("uncapped").set(want.wanted)
        metrics.HEADROOM.labels("kept").set(kept)
        metrics.HEADROOM_HELD.labels("cpu").set(want.held_cpu / 1000)
        metrics.HEADROOM_HELD.labels("memory").set(want.held_memory)


def _replicas(obj: Obj | None) -> int:
    if obj is None:
        return 0
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)
