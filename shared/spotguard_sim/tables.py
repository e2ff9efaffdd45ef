"""Server-side printing: meta.k8s.io/v1 Table responses, as ``kubectl get`` asks for.

https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables
"""

from __future__ import annotations

import datetime
from typing import Any

from spotguard_sim import resources

Obj = dict[str, Any]


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _age(obj: Obj, now: float) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    try:
        then = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return "<unknown>"
    seconds = int((now or datetime.datetime.now(datetime.UTC).timestamp()) - then.timestamp())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _col(name: str, type_: str = "string", priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": type_, "format": fmt, "description": name, "priority": priority}


def _pod(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("phase", "Pending")
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    return [f"{ready}/{len(containers)}", phase, restarts, _age(obj, now),
            status.get("podIP") or "<none>", spec.get("nodeName") or "<none>"]


def _node(obj: Obj, now: float) -> list[Any]:
    state = {"True": "Ready", "False": "NotReady"}.get(_condition(obj, "Ready"), "Unknown")
    if (obj.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (obj.get("metadata") or {}).get("labels") or {}
    roles = ",".join(sorted(k.split("/", 1)[1] for k in labels
                            if k.startswith("node-role.kubernetes.io/"))) or "<none>"
    version = ((obj.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [state, roles, _age(obj, now), version]


def _deployment(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
            status.get("updatedReplicas", 0), status.get("availableReplicas", 0), _age(obj, now)]


def _replicaset(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [spec.get("replicas", 0), status.get("replicas", 0), status.get("readyReplicas", 0),
            _age(obj, now)]


def _statefulset(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}", _age(obj, now)]


def _pdb(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [spec.get("minAvailable", "N/A"), spec.get("maxUnavailable", "N/A"),
            status.get("disruptionsAllowed", 0), _age(obj, now)]


def _namespace(obj: Obj, now: float) -> list[Any]:
    return [(obj.get("status") or {}).get("phase", "Active"), _age(obj, now)]


def _event(obj: Obj, now: float) -> list[Any]:
    involved = obj.get("involvedObject") or {}
    return [_age(obj, now), obj.get("type", ""), obj.get("reason", ""),
            f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
            obj.get("message", "")]


def _configmap(obj: Obj, now: float) -> list[Any]:
    return [len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), _age(obj, now)]


def _lease(obj: Obj, now: float) -> list[Any]:
    return [(obj.get("spec") or {}).get("holderIdentity") or "", _age(obj, now)]


def _hpa(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ref = spec.get("scaleTargetRef") or {}
    return [f"{ref.get('kind', '')}/{ref.get('name', '')}", spec.get("minReplicas", 1),
            spec.get("maxReplicas", 0), status.get("currentReplicas", 0), _age(obj, now)]


def _daemonset(obj: Obj, now: float) -> list[Any]:
    status = obj.get("status") or {}
    selector = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    return [status.get("desiredNumberScheduled", 0), status.get("currentNumberScheduled", 0),
            status.get("numberReady", 0), status.get("updatedNumberScheduled", 0),
            status.get("numberAvailable", 0),
            ",".join(f"{k}={v}" for k, v in selector.items()) or "<none>", _age(obj, now)]


def _job(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    done = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    state = ("Complete" if "Complete" in done else "Failed" if "Failed" in done
             else "Suspended" if "Suspended" in done else "Running")
    return [state, f"{status.get('succeeded', 0)}/{spec.get('completions', 1)}", _age(obj, now)]


def _cronjob(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [spec.get("schedule", ""), spec.get("timeZone") or "<none>", spec.get("suspend", False),
            len(status.get("active") or []), status.get("lastScheduleTime") or "<none>",
            _age(obj, now)]


def _rc(obj: Obj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [spec.get("replicas", 0), status.get("replicas", 0), status.get("readyReplicas", 0),
            _age(obj, now)]


def _condition(obj: Obj, type_: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return str(cond.get("status", "Unknown"))
    return "Unknown"


def _nodepool(obj: Obj, now: float) -> list[Any]:
    ref = ((((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeClassRef") or {})
    return [ref.get("name", ""), (obj.get("status") or {}).get("nodes", 0), _condition(obj, "Ready"),
            _age(obj, now)]


def _nodeclaim(obj: Obj, now: float) -> list[Any]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return [labels.get("node.kubernetes.io/instance-type", ""), labels.get("karpenter.sh/capacity-type", ""),
            labels.get("topology.kubernetes.io/zone", ""), (obj.get("status") or {}).get("nodeName", ""),
            _condition(obj, "Ready"), _age(obj, now)]


def _apiservice(obj: Obj, now: float) -> list[Any]:
    """kube-aggregator's ConvertToTable (pkg/registry/apiservice/etcd/etcd.go)."""
    ref = (obj.get("spec") or {}).get("service")
    service = f"{ref.get('namespace', '')}/{ref.get('name', '')}" if ref else "Local"
    available = "Unknown"
    cond = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Available"), None)
    if cond is not None:
        available = str(cond.get("status", ""))
        if available != "True" and cond.get("reason"):
            available = f"{available} ({cond['reason']})"
    return [service, available, _age(obj, now)]


COLUMNS: dict[str, tuple[list[Obj], Any]] = {
    # the printer columns of Karpenter's CRDs (karpenter.sh_nodepools.yaml, karpenter.sh_nodeclaims.yaml)
    "nodepools": ([_col("NodeClass"), _col("Nodes", "integer"), _col("Ready"), _col("Age")], _nodepool),
    "nodeclaims": ([_col("Type"), _col("Capacity"), _col("Zone"), _col("Node"), _col("Ready"), _col("Age")],
                   _nodeclaim),
    "daemonsets": ([_col("Desired", "integer"), _col("Current", "integer"), _col("Ready", "integer"),
                    _col("Up-to-date", "integer"), _col("Available", "integer"),
                    _col("Node Selector"), _col("Age")], _daemonset),
    "jobs": ([_col("Status"), _col("Completions"), _col("Age")], _job),
    "cronjobs": ([_col("Schedule"), _col("Timezone"), _col("Suspend", "boolean"),
                  _col("Active", "integer"), _col("Last Schedule"), _col("Age")], _cronjob),
    "replicationcontrollers": ([_col("Desired", "integer"), _col("Current", "integer"),
                                _col("Ready", "integer"), _col("Age")], _rc),
    "events": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"),
                _col("Message")], _event),
    "configmaps": ([_col("Data", "integer"), _col("Age")], _configmap),
    "leases": ([_col("Holder"), _col("Age")], _lease),
    "horizontalpodautoscalers": ([_col("Reference"), _col("MinPods", "integer"),
                                  _col("MaxPods", "integer"), _col("Replicas", "integer"),
                                  _col("Age")], _hpa),
    "pods": ([_col("Ready"), _col("Status"), _col("Restarts", "integer"), _col("Age"),
              _col("IP", priority=1), _col("Node", priority=1)], _pod),
    "nodes": ([_col("Status"), _col("Roles"), _col("Age"), _col("Version")], _node),
    "deployments": ([_col("Ready"), _col("Up-to-date", "integer"),
                     _col("Available", "integer"), _col("Age")], _deployment),
    "replicasets": ([_col("Desired", "integer"), _col("Current", "integer"),
                     _col("Ready", "integer"), _col("Age")], _replicaset),
    "statefulsets": ([_col("Ready"), _col("Age")], _statefulset),
    "poddisruptionbudgets": ([_col("Min Available"), _col("Max Unavailable"),
                              _col("Allowed Disruptions", "integer"), _col("Age")], _pdb),
    "namespaces": ([_col("Status"), _col("Age")], _namespace),
    "apiservices": ([_col("Service"), _col("Available"), _col("Age")], _apiservice),
}


def table(rtype: resources.ResourceType, objs: list[Obj], rv: str,
          include_object: str | None, now: float = 0.0) -> Obj:
    """A Table of ``objs``; ages are computed at ``now`` (simulated epoch seconds)."""
    columns, cells = COLUMNS.get(rtype.plural, ([_col("Age")], lambda o, t: [_age(o, t)]))
    definitions = [_col("Name", fmt="name"), *columns]
    rows = []
    for obj in objs:
        if include_object == "Object":
            embedded: Obj = obj
        elif include_object == "None":
            embedded = {}
        else:
            embedded = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata") or {}}
        row: Obj = {"cells": [obj["metadata"]["name"], *cells(obj, now)]}
        if embedded:
            row["object"] = embedded
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": definitions, "rows": rows}
