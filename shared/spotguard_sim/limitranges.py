"""LimitRange (core/v1): the API's defaulting of a LimitRange, and the LimitRanger admission
plugin's two phases for pods.

Sources (kubernetes/kubernetes): ``plugin/pkg/admission/limitranger/admission.go``
(``PodMutateLimitFunc``: a Container item's ``defaultRequest`` and ``default`` fill what a
container, or an init container, does not state, and the pod is annotated
``kubernetes.io/limit-ranger: "LimitRanger plugin set: cpu, memory request for container app;
cpu limit for container app"``; ``PodValidateLimitFunc``: ``min``, ``max`` and
``maxLimitRequestRatio`` per Container and per Pod, every failure joined in one 403
Forbidden; pod updates are not looked at, ``SupportsAttributes``), and
``pkg/apis/core/v1/defaults.go`` (``SetDefaults_LimitRangeItem``: a Container item's
``default`` is its ``max`` where unset, its ``defaultRequest`` the ``default``, else the
``min``; ``SetDefaults_Pod``: a container's limits are its requests where it states none).
https://kubernetes.io/docs/concepts/policy/limit-range/

The mutating phase runs before the mutating webhooks and the validating one after them, as
kube-apiserver orders its plugins (LimitRanger before MutatingAdmissionWebhook, ResourceQuota
last).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from spotguard.policy import quantities

from spotguard_sim import errors

Obj = dict[str, Any]
ANNOTATION = "kubernetes.io/limit-ranger"
CONTAINER, POD, CLAIM = "Container", "Pod", "PersistentVolumeClaim"
TYPES = (CONTAINER, POD, CLAIM)
_MAX_MILLI = (2**63 - 1) // 1000  # resource.MaxMilliValue


def _value(text: Any) -> int:
    """A quantity in milli-units (as ``MilliValue``; ``requestLimitEnforcedValues`` compares
    at milli precision whenever the values allow it)."""
    return quantities.parse(text, milli=True)


def default_limit_range(obj: Obj) -> None:
    """``SetDefaults_LimitRangeItem`` on every Container item."""
    for item in (obj.get("spec") or {}).get("limits") or []:
        if not isinstance(item, dict) or item.get("type") != CONTAINER:
            continue
        default = item.setdefault("default", {})
        request = item.setdefault("defaultRequest", {})
        for key, value in (item.get("max") or {}).items():
            default.setdefault(key, value)
        for key, value in default.items():
            request.setdefault(key, value)
        for key, value in (item.get("min") or {}).items():
            request.setdefault(key, value)
        if not default:
            item.pop("default")
        if not request:
            item.pop("defaultRequest")


def validate_limit_range(obj: Obj) -> list[dict[str, str]]:
    """The checks of ``ValidateLimitRange`` that a scenario can trip: the type, and the order
    min <= defaultRequest <= default <= max of each resource."""
    causes: list[dict[str, str]] = []
    for i, item in enumerate((obj.get("spec") or {}).get("limits") or []):
        path = f"spec.limits[{i}]"
        kind = (item or {}).get("type")
        if not kind:
            causes.append({"field": f"{path}.type", "message": "Required value"})
            continue
        if kind not in TYPES:
            causes.append({"field": f"{path}.type", "message": f'Unsupported value: "{kind}": supported values: '
                           + ", ".join(f'"{t}"' for t in TYPES)})
            continue
        fields = {f: item.get(f) or {} for f in ("min", "max", "default", "defaultRequest")}
        if kind != CONTAINER and (fields["default"] or fields["defaultRequest"]):
            which = "default" if fields["default"] else "defaultRequest"
            causes.append({"field": f"{path}.{which}", "message": f"Forbidden: may not be specified when "
                           f"`type` is '{kind}'"})
        for key in set().union(*fields.values()):
            try:
                got = {f: _value(v[key]) for f, v in fields.items() if key in v}
            except ValueError as exc:
                causes.append({"field": f"{path}.{key}", "message": f"Invalid value: {exc}"})
                continue
            text = {f: str(v[key]) for f, v in fields.items() if key in v}
            pairs = (("min", "max", "min value {a} is greater than max value {b}"),
                     ("defaultRequest", "default",
                      "default request value {a} is greater than default limit value {b}"),
                     ("min", "defaultRequest", "min value {a} is greater than default request value {b}"),
                     ("defaultRequest", "max", "default request value {a} is greater than max value {b}"),
                     ("min", "default", "min value {a} is greater than default value {b}"),
                     ("default", "max", "default value {a} is greater than max value {b}"))
            for low, high, message in pairs:
                if low in got and high in got and got[low] > got[high]:
                    field = f"{path}.{'min' if low == 'min' else low}[{key}]"
                    causes.append({"field": field, "message": "Invalid value: \"" + text[low] + "\": "
                                   + message.format(a=text[low], b=text[high])})
    return causes


def default_pod_requests(spec: Mapping[str, Any]) -> None:
    """``SetDefaults_Pod``: a container with limits gets each unstated request equal to its limit
    (pods only: a template is left as written)."""
    for container in itertools.chain(spec.get("containers") or [], spec.get("initContainers") or []):
        if not isinstance(container, dict):
            continue
        res = container.get("resources")
        if not isinstance(res, dict) or not res.get("limits"):
            continue
        requests = res.setdefault("requests", {})
        for key, value in res["limits"].items():
            requests.setdefault(key, value)


def mutate_pod(pod: Obj, ranges: Iterable[Obj]) -> bool:
    """``PodMutateLimitFunc`` for each LimitRange of the namespace; whether the pod changed."""
    changed = False
    for limit_range in ranges:
        default_requests: dict[str, Any] = {}
        default_limits: dict[str, Any] = {}
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if item.get("type") == CONTAINER:
                default_requests.update(item.get("defaultRequest") or {})
                default_limits.update(item.get("default") or {})
        if not default_requests and not default_limits:
            continue
        notes: list[str] = []
        spec = pod.get("spec") or {}
        for prefix, field in (("container", "containers"), ("init container", "initContainers")):
            for container in spec.get(field) or []:
                res = container.setdefault("resources", {})
                limits = res.setdefault("limits", {})
                requests = res.setdefault("requests", {})
                set_limits = sorted(k for k in default_limits if k not in limits)
                set_requests = sorted(k for k in default_requests if k not in requests)
                for k in set_limits:
                    limits[k] = default_limits[k]
                for k in set_requests:
                    requests[k] = default_requests[k]
                if not limits:
                    res.pop("limits")
                if not requests:
                    res.pop("requests")
                name = container.get("name", "")
                if set_requests:
                    notes.append(", ".join(set_requests) + f" request for {prefix} {name}")
                if set_limits:
                    notes.append(", ".join(set_limits) + f" limit for {prefix} {name}")
        if notes:
            pod.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = (
                "LimitRanger plugin set: " + "; ".join(notes))
            changed = True
    return changed


def _pod_totals(spec: Mapping[str, Any], field: str) -> dict[str, int]:
    """``podRequests``/``podLimits``: the containers' sum (sidecars included), at least each
    init container's (plus the sidecars started before it)."""
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for k, v in ((container.get("resources") or {}).get(field) or {}).items():
            total[k] = total.get(k, 0) + _value(v)
    for container in spec.get("initContainers") or []:
        own = {k: _value(v) for k, v in ((container.get("resources") or {}).get(field) or {}).items()}
        if container.get("restartPolicy") == "Always":
            for k, v in own.items():
                total[k] = total.get(k, 0) + v
                sidecars[k] = sidecars.get(k, 0) + v
            seen = dict(sidecars)
        else:
            seen = {k: own.get(k, 0) + sidecars.get(k, 0) for k in set(own) | set(sidecars)}
        for k, v in seen.items():
            init_max[k] = max(init_max.get(k, 0), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, 0), v)
    return total


def _render(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _check(kind: str, item: Mapping[str, Any], requests: Mapping[str, Any], limits: Mapping[str, Any],
           out: list[str]) -> None:
    """minConstraint, maxConstraint and limitRequestRatioConstraint (their messages)."""
    for key, enforced in (item.get("min") or {}).items():
        if key not in requests:
            out.append(f"minimum {key} usage per {kind} is {enforced}.  No request is specified")
        elif _value(requests[key]) < _value(enforced):
            out.append(f"minimum {key} usage per {kind} is {enforced}, but request is {requests[key]}")
        elif key in limits and _value(limits[key]) < _value(enforced):
            out.append(f"minimum {key} usage per {kind} is {enforced}, but limit is {limits[key]}")
    for key, enforced in (item.get("max") or {}).items():
        if key not in limits:
            out.append(f"maximum {key} usage per {kind} is {enforced}.  No limit is specified")
        elif _value(limits[key]) > _value(enforced):
            out.append(f"maximum {key} usage per {kind} is {enforced}, but limit is {limits[key]}")
        elif key in requests and _value(requests[key]) > _value(enforced):
            out.append(f"maximum {key} usage per {kind} is {enforced}, but request is {requests[key]}")
    for key, enforced in (item.get("maxLimitRequestRatio") or {}).items():
        req = _value(requests[key]) if key in requests else 0
        lim = _value(limits[key]) if key in limits else 0
        if req == 0:
            out.append(f"{key} max limit to request ratio per {kind} is {enforced}, but no request is "
                       "specified or request is 0")
        elif lim == 0:
            out.append(f"{key} max limit to request ratio per {kind} is {enforced}, but no limit is "
                       "specified or limit is 0")
        elif lim / req * 1000 > _value(enforced):
            out.append(f"{key} max limit to request ratio per {kind} is {enforced}, but provided ratio "
                       f"is {lim / req:f}")


def validate_pod(pod: Obj, ranges: Iterable[Obj]) -> None:
    """``PodValidateLimitFunc`` for each LimitRange; the first that fails refuses the pod with a
    403 naming every failed constraint of that LimitRange (``utilerrors.NewAggregate``)."""
    spec = pod.get("spec") or {}
    name = str((pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName")
               or "Unknown")
    for limit_range in ranges:
        failures: list[str] = []
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if item.get("type") == CONTAINER:
                for container in itertools.chain(spec.get("containers") or [], spec.get("initContainers") or []):
                    res = container.get("resources") or {}
                    _check(CONTAINER, item, res.get("requests") or {}, res.get("limits") or {}, failures)
            elif item.get("type") == POD:
                requests = {k: _render(v) if k == "cpu" else str(v // 1000)
                            for k, v in _pod_totals(spec, "requests").items()}
                limits = {k: _render(v) if k == "cpu" else str(v // 1000)
                          for k, v in _pod_totals(spec, "limits").items()}
                _check(POD, item, requests, limits, failures)
        if failures:
            message = failures[0] if len(failures) == 1 else "[" + ", ".join(failures) + "]"
            raise errors.forbidden("pods", name, message)
