"""Per-type create and update rules, as kube-apiserver's registry strategies and
built-in admission plugins apply them (pkg/registry/<group>/<kind>/strategy.go,
pkg/apis/<group>/v1/defaults.go, pkg/apis/<group>/validation,
plugin/pkg/admission/priority).

The store calls, in the order kube-apiserver runs them:
- ``default(resource, obj)``: defaults of the types added beside the first
  ones (DaemonSets, Jobs, CronJobs, ReplicationControllers, PriorityClasses);
  returns the pod template specs the store defaults as pod specs;
- ``admit(store, resource, obj)``: the Priority admission plugin, before the
  mutating webhooks (it resolves ``priorityClassName`` into ``priority``; an
  unknown class is 403 Forbidden, as the plugin answers);
- ``prepare_create(rtype, obj)`` once the uid is set: a Job's generated
  selector and labels; validation of the new types;
- ``validate_update(rtype, old, new)``: immutable fields (422), pod update
  rules, no finalizer added while deleting.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Protocol

from spotguard_sim import apiregistration, cron, errors, eventsapi, resources, webhookconfig

Obj = dict[str, Any]

# pkg/apis/scheduling/types.go: the classes kube-apiserver creates at bootstrap
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2_000_001_000,
                           "system-cluster-critical": 2_000_000_000}
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# Status fields the API always serialises (not omitempty): clients rely on them, and refuse
# objects without the required ones (apps/v1 DaemonSetStatus).
_STATUS_DEFAULTS: dict[str, Obj] = {
    "daemonsets": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0,
                   "numberMisscheduled": 0, "numberReady": 0},
    "replicationcontrollers": {"replicas": 0},
    "replicasets": {"replicas": 0},
    "statefulsets": {"replicas": 0, "availableReplicas": 0},
    "poddisruptionbudgets": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                             "expectedPods": 0},
    "horizontalpodautoscalers": {"desiredReplicas": 0},
}


class _Store(Protocol):
    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj: ...

    def list(self, resource: str, namespace: str | None = None,
             label_selector: str | None = None,
             field_selector: str | None = None) -> tuple[list[Obj], str]: ...


# ------------------------------------------------------------------ defaults


def _spec_of(template: Any) -> Obj | None:
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        spec: Obj = template["spec"]
        return spec
    return None


def default(resource: str, obj: Obj) -> list[Obj]:
    """Apply the type's defaults; return the pod template specs to default as pod specs."""
    spec = obj.get("spec")
    templates: list[Obj] = []
    if resource in _STATUS_DEFAULTS:
        status = obj.get("status")
        if not isinstance(status, dict):
            status = obj["status"] = {}
        for key, value in _STATUS_DEFAULTS[resource].items():
            status.setdefault(key, value)
    if resource == "priorityclasses":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
        return templates
    if resource == "apiservices":
        apiregistration.default(obj)
        return templates
    if not isinstance(spec, dict):
        return templates
    if resource == "daemonsets":  # apps/v1 SetDefaults_DaemonSet
        strategy = spec.setdefault("updateStrategy", {})
        if isinstance(strategy, dict):
            strategy.setdefault("type", "RollingUpdate")
            if strategy["type"] == "RollingUpdate":
                rolling = strategy.setdefault("rollingUpdate", {})
                if isinstance(rolling, dict):
                    rolling.setdefault("maxUnavailable", 1)
                    rolling.setdefault("maxSurge", 0)
        spec.setdefault("revisionHistoryLimit", 10)
        templates.append(_spec_of(spec.get("template")) or {})
    elif resource == "jobs":
        _default_job_spec(spec)
        templates.append(_spec_of(spec.get("template")) or {})
    elif resource == "cronjobs":  # batch/v1 SetDefaults_CronJob
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job_template = spec.get("jobTemplate")
        if isinstance(job_template, dict):
            templates.append(_spec_of(_spec_of(job_template) and job_template["spec"].get(
                "template")) or {})
    elif resource == "replicationcontrollers":  # core/v1 SetDefaults_ReplicationController
        template = spec.get("template")
        labels = ((template or {}).get("metadata") or {}).get("labels") if isinstance(
            template, dict) else None
        if labels:
            if not spec.get("selector"):
                spec["selector"] = dict(labels)
            meta = obj.setdefault("metadata", {})
            if not meta.get("labels"):
                meta["labels"] = dict(labels)
        spec.setdefault("replicas", 1)
        templates.append(_spec_of(template) or {})
    return [t for t in templates if t]


def _default_job_spec(spec: Obj) -> None:
    """batch/v1 SetDefaults_Job."""
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if not spec.get("podFailurePolicy"):
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    spec.setdefault("manualSelector", None)
    if spec["manualSelector"] is None:
        del spec["manualSelector"]


# ------------------------------------------------------------------ admission


def bootstrap_objects() -> list[tuple[str, Obj]]:
    """Objects kube-apiserver creates at start (besides namespaces)."""
    return [
        ("priorityclasses", {
            "metadata": {"name": name}, "value": value, "globalDefault": False,
            "description": "Used for system critical pods that must not be moved from their "
                           "current node." if name == "system-node-critical" else
                           "Used for system critical pods that must run in the cluster, but "
                           "can be moved to another node if necessary.",
        })
        for name, value in SYSTEM_PRIORITY_CLASSES.items()
    ]


def admit(store: _Store, resource: str, obj: Obj) -> None:
    """The Priority admission plugin on pod creation (plugin/pkg/admission/priority)."""
    if resource != "pods":
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    meta = obj.get("metadata") or {}
    name = str(spec.get("priorityClassName") or "")
    if not name:
        classes, _ = store.list("priorityclasses")
        default_class = next((c for c in classes if c.get("globalDefault")), None)
        if default_class is None:
            spec["priority"] = 0
            return
        spec["priorityClassName"] = default_class["metadata"]["name"]
        pclass = default_class
    else:
        try:
            pclass = store.get("priorityclasses", name)
        except errors.NotFound:
            # admission.NewForbidden: the object's name, its generateName before one is made
            raise errors.forbidden(
                "pods", str(meta.get("name") or meta.get("generateName") or "Unknown"),
                f"no PriorityClass with name {name} was found",
            ) from None
    spec["priority"] = int(pclass.get("value") or 0)
    if pclass.get("preemptionPolicy"):
        spec["preemptionPolicy"] = pclass["preemptionPolicy"]


# ------------------------------------------------------------------ create


def _labels_match(selector: Any, labels: Any) -> bool:
    from spotguard_sim import scheduler

    return isinstance(selector, dict) and scheduler.match_label_selector(
        selector, labels if isinstance(labels, dict) else {})


def prepare_create(rtype: resources.ResourceType, obj: Obj, now: str = "") -> None:
    """Create-time rules that need the uid; raise Invalid (422) on a bad object. ``now``:
    the creation time (an APIService's first condition carries it)."""
    name = str(obj["metadata"].get("name", ""))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    causes: list[dict[str, str]] = []
    if rtype.plural == "jobs":
        if not spec.get("manualSelector"):  # generateSelector in the Job strategy
            uid = obj["metadata"]["uid"]
            template = spec.setdefault("template", {})
            tmeta = template.setdefault("metadata", {})
            labels = tmeta.setdefault("labels", {})
            labels.update({JOB_UID_LABEL: uid, JOB_NAME_LABEL: name, "controller-uid": uid,
                           "job-name": name})
            spec["selector"] = {"matchLabels": {JOB_UID_LABEL: uid}}
        causes += _job_causes(spec)
    elif rtype.plural == "cronjobs":
        schedule = str(spec.get("schedule") or "").strip()
        if not schedule:
            causes.append({"field": "spec.schedule", "message": "Required value"})
        else:
            try:
                cron.parse(schedule, spec.get("timeZone"))
            except cron.ScheduleError as exc:
                causes.append({"field": "spec.schedule",
                               "message": f"Invalid value: {json.dumps(schedule)}: {exc}"})
        job_spec = (spec.get("jobTemplate") or {}).get("spec") or {}
        causes += _restart_causes(job_spec.get("template"), ("OnFailure", "Never"),
                                  "spec.jobTemplate.spec.template.spec.restartPolicy")
    elif rtype.plural == "daemonsets":
        causes += _selector_causes(spec)
        causes += _restart_causes(spec.get("template"), ("Always",),
                                  "spec.template.spec.restartPolicy")
    elif rtype.plural == "replicationcontrollers":
        selector = spec.get("selector") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not selector:
            causes.append({"field": "spec.selector", "message": "Required value"})
        elif any(labels.get(k) != v for k, v in selector.items()):
            causes.append({"field": "spec.template.metadata.labels", "message":
                           "Invalid value: `selector` does not match template `labels`"})
    elif rtype.plural == "mutatingwebhookconfigurations":
        causes += webhookconfig.causes(obj)
    elif rtype.plural == "events":
        causes += eventsapi.legacy_causes(obj)
    elif rtype.plural == "apiservices":
        apiregistration.prepare_create(obj, now)
        causes += apiregistration.causes(obj)
    elif rtype.plural == "priorityclasses":
        value = obj.get("value")
        if not isinstance(value, int) or isinstance(value, bool):
            causes.append({"field": "value", "message": "Required value"})
        elif value > 1_000_000_000 and name not in SYSTEM_PRIORITY_CLASSES:
            causes.append({"field": "value", "message": "Forbidden: maximum allowed value of a "
                           "user defined priority is 1000000000"})
    if causes:
        raise errors.invalid(rtype.kind, name, causes, rtype.group)


def _selector_causes(spec: Obj) -> list[dict[str, str]]:
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or
                                              selector.get("matchExpressions")):
        return [{"field": "spec.selector", "message": "Required value"}]
    if not _labels_match(selector, labels):
        return [{"field": "spec.template.metadata.labels", "message":
                 "Invalid value: `selector` does not match template `labels`"}]
    return []


def _restart_causes(template: Any, allowed: tuple[str, ...], field: str) -> list[dict[str, str]]:
    policy = ((template or {}).get("spec") or {}).get("restartPolicy", "Always") if isinstance(
        template, dict) else "Always"
    if policy in allowed:
        return []
    quoted = ", ".join(f'"{a}"' for a in allowed)
    return [{"field": field, "message": f'Unsupported value: "{policy}": supported values: {quoted}'}]


def _job_causes(spec: Obj) -> list[dict[str, str]]:
    causes = _restart_causes(spec.get("template"), ("OnFailure", "Never"),
                             "spec.template.spec.restartPolicy")
    for field in ("parallelism", "completions", "backoffLimit"):
        value = spec.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            causes.append({"field": f"spec.{field}", "message": f"Invalid value: {value!r}: must "
                           "be greater than or equal to 0"})
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels")
    if not _labels_match(spec.get("selector"), labels):
        causes.append({"field": "spec.template.metadata.labels", "message":
                       "Invalid value: `selector` does not match template `labels`"})
    return causes


# ------------------------------------------------------------------ update

POD_UPDATE_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
    "set to 1 if it was previously negative)"
)
_SELECTOR_IMMUTABLE = ("deployments", "replicasets", "daemonsets", "statefulsets", "jobs")
# apps/v1 ValidateStatefulSetUpdate: the only spec fields an update may change
_STS_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy",
                "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def _immutable(field: str, value: Any) -> dict[str, str]:
    return {"field": field, "message": f"Invalid value: {json.dumps(value, sort_keys=True)}: "
            "field is immutable"}


def validate_update(rtype: resources.ResourceType, old: Obj, new: Obj) -> None:
    """Raise Invalid (422) for a change kube-apiserver's update validation forbids."""
    causes: list[dict[str, str]] = []
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if rtype.plural == "events":
        causes += eventsapi.legacy_causes(new)
    if old_meta.get("deletionTimestamp"):
        added = [f for f in new_meta.get("finalizers") or []
                 if f not in (old_meta.get("finalizers") or [])]
        if added:  # apimachinery ValidateObjectMetaUpdate
            causes.append({"field": "metadata.finalizers", "message": "Forbidden: no new "
                           f"finalizers can be added if the object is being deleted, found new "
                           f"finalizers {json.dumps(added)}"})
    old_spec = old.get("spec") if isinstance(old.get("spec"), dict) else {}
    new_spec = new.get("spec") if isinstance(new.get("spec"), dict) else {}
    assert isinstance(old_spec, dict) and isinstance(new_spec, dict)
    if rtype.plural in _SELECTOR_IMMUTABLE and new_spec.get("selector") != old_spec.get("selector"):
        causes.append(_immutable("spec.selector", new_spec.get("selector")))
    if rtype.plural == "statefulsets":
        changed = sorted(k for k in set(old_spec) | set(new_spec)
                         if k not in _STS_MUTABLE and k != "selector"
                         and old_spec.get(k) != new_spec.get(k))
        if changed:
            causes.append({"field": "spec", "message": "Forbidden: updates to statefulset spec "
                           "for fields other than 'replicas', 'ordinals', 'template', "
                           "'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and "
                           "'minReadySeconds' are forbidden"})
    if rtype.plural == "jobs":
        if old_spec.get("completions") != new_spec.get("completions"):
            causes.append(_immutable("spec.completions", new_spec.get("completions")))
        if not old_spec.get("suspend") and old_spec.get("template") != new_spec.get("template"):
            causes.append(_immutable("spec.template", new_spec.get("template")))
    if rtype.plural in ("daemonsets", "jobs", "cronjobs", "replicationcontrollers",
                        "mutatingwebhookconfigurations"):
        try:
            prepare_create(rtype, {**new, "metadata": {**new_meta, "uid": old_meta.get("uid")},
                                   "spec": {**new_spec, "manualSelector": True}}
                           if rtype.plural == "jobs" else new)
        except errors.Invalid as exc:
            causes += list(exc.details.get("causes") or [])
    if rtype.plural == "pods":
        causes += _pod_update_causes(old_spec, new_spec)
    if rtype.plural == "apiservices":
        causes += apiregistration.causes(new)
    if causes:
        raise errors.invalid(rtype.kind, str(new_meta.get("name", "")), causes, rtype.group)


def validate_status_update(rtype: resources.ResourceType, new: Obj) -> None:
    """Raise Invalid (422) for a status the type's status strategy refuses."""
    causes = apiregistration.status_causes(new) if rtype.plural == "apiservices" else []
    if causes:
        raise errors.invalid(rtype.kind, str((new.get("metadata") or {}).get("name", "")), causes,
                             rtype.group)


def _pod_update_causes(old: Obj, new: Obj) -> list[dict[str, str]]:
    """pkg/apis/core/validation ValidatePodUpdate (without in-place resize, which goes
    through the pods/resize subresource): only the listed fields may change."""
    causes: list[dict[str, str]] = []
    munged = copy.deepcopy(old)
    for field in ("containers", "initContainers"):
        old_list, new_list = munged.get(field) or [], new.get(field) or []
        if len(old_list) == len(new_list):
            for o, n in zip(old_list, new_list, strict=True):
                if isinstance(o, dict) and isinstance(n, dict) and "image" in n:
                    o["image"] = n["image"]
    for field in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        if field in new:
            munged[field] = new[field]
        else:
            munged.pop(field, None)
    old_tol, new_tol = old.get("tolerations") or [], new.get("tolerations") or []
    if all(t in new_tol for t in old_tol):
        munged["tolerations"] = copy.deepcopy(new_tol)
    else:
        causes.append({"field": "spec.tolerations", "message": "Forbidden: existing toleration "
                       "can not be modified except its tolerationSeconds"})
        munged["tolerations"] = copy.deepcopy(new_tol)
    old_gates, new_gates = old.get("schedulingGates") or [], new.get("schedulingGates") or []
    if all(g in old_gates for g in new_gates):
        if new_gates:
            munged["schedulingGates"] = copy.deepcopy(new_gates)
        else:
            munged.pop("schedulingGates", None)
    else:
        causes.append({"field": "spec.schedulingGates", "message": "Forbidden: only deletion "
                       "is allowed, but found new scheduling gate"})
    if old_gates and not old.get("nodeName"):
        # a gated pod may gain node selector terms and affinity (PodSchedulingReadiness)
        for field in ("nodeSelector", "affinity"):
            if field in new:
                munged[field] = copy.deepcopy(new[field])
    if old.get("nodeName") and new.get("nodeName") != old.get("nodeName"):
        munged["nodeName"] = new.get("nodeName")  # reported by the caller's nodeName rule
    elif not old.get("nodeName") and new.get("nodeName"):
        munged["nodeName"] = new["nodeName"]
    if munged != new and not causes:
        causes.append({"field": "spec", "message": POD_UPDATE_FORBIDDEN})
    return causes
