"""ResourceQuota: what an object costs, and the admission that refuses what a namespace's
quota cannot hold.

Sources (kubernetes/kubernetes): ``staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go``
(``checkRequest``: "failed quota", "status unknown for quota", "exceeded quota: <name>,
requested: ..., used: ..., limited: ..." with only the exceeded resources),
``pkg/quota/v1/evaluator/core/pods.go`` (a pod costs ``pods``, ``count/pods``, ``cpu`` and
``requests.cpu``, ``limits.cpu``, the same for memory and ephemeral storage; a terminal
pod, or one past its deletion grace, costs only ``count/pods``; a quota on cpu or memory
makes every container state it: "must specify requests.cpu for: app"), and the generic
object counts (``count/<resource>.<group>``; ``services``, ``configmaps``, ``secrets``,
``replicationcontrollers``, ``resourcequotas``, ``persistentvolumeclaims``).
https://kubernetes.io/docs/concepts/policy/resource-quotas/

Usage is counted from the stored objects at the moment of the write (under the store's
lock, so parallel creates cannot overshoot), as a quota controller that has just
recalculated would hold it; ``controllers/resourcequota.py`` writes it to the quota's
status.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from spotguard.policy import quantities

from spotguard_sim import errors, resources

Obj = dict[str, Any]
VALIDATION = frozenset({"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"})
POD_RESOURCES = VALIDATION | {"pods", "count/pods", "ephemeral-storage", "requests.ephemeral-storage",
                              "limits.ephemeral-storage"}  # fmt: skip
LEGACY_COUNTS = frozenset({"services", "configmaps", "secrets", "replicationcontrollers", "resourcequotas",
                           "persistentvolumeclaims"})  # fmt: skip
_MILLI = frozenset({"cpu", "requests.cpu", "limits.cpu"})
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def count_key(rtype: resources.ResourceType) -> str:
    return f"count/{rtype.plural}" + (f".{rtype.group}" if rtype.group else "")


def parse(key: str, value: Any) -> int:
    return quantities.parse(value, milli=key in _MILLI)


def render(key: str, value: int, like: Any = None) -> str:
    """A quantity's canonical text: millicores for cpu, binary suffixes when ``like`` (the
    quota's own value) has one, decimal ones otherwise."""
    if key in _MILLI:
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    binary = isinstance(like, str) and like.endswith("i")
    for suffix, size in _BINARY if binary else _DECIMAL:
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)


def _declared(container: Mapping[str, Any], field: str) -> dict[str, int]:
    return quantities.parse_resources((container.get("resources") or {}).get(field))


def _pod_total(spec: Mapping[str, Any], field: str) -> dict[str, int]:
    """Requests or limits of a pod as the scheduler sees them: the containers' sum, at least
    each init container's, plus the overhead (``resourcehelper.PodRequests``/``PodLimits``)."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in _declared(container, field).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in _declared(container, field).items():
            total[name] = max(total.get(name, 0), value)
    for name, value in quantities.parse_resources(spec.get("overhead")).items():
        if name in total:
            total[name] += value
    return total


def _past_grace(meta: Mapping[str, Any], now: float) -> bool:
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if not stamp or grace is None:
        return False
    when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    return now > when + float(grace)


def pod_usage(pod: Mapping[str, Any], now: float) -> dict[str, int]:
    """``PodUsageFunc``."""
    out = {"count/pods": 1}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or _past_grace(pod.get("metadata") or {}, now):
        return out
    spec = pod.get("spec") or {}
    requests, limits = _pod_total(spec, "requests"), _pod_total(spec, "limits")
    out["pods"] = 1
    for name in ("cpu", "memory", "ephemeral-storage"):
        if name in requests:
            out[name] = out[f"requests.{name}"] = requests[name]
        if name in limits:
            out[f"limits.{name}"] = limits[name]
    return out


def usage(rtype: resources.ResourceType, obj: Mapping[str, Any], now: float) -> dict[str, int]:
    """What one object costs."""
    if rtype.plural == "pods" and not rtype.group:
        return pod_usage(obj, now)
    out = {count_key(rtype): 1}
    if not rtype.group and rtype.plural in LEGACY_COUNTS:
        out[rtype.plural] = 1
    return out


def tracked(rtype: resources.ResourceType, hard: Iterable[str]) -> list[str]:
    """The quota's resources that this kind of object is charged for (``MatchingResources``)."""
    if rtype.plural == "pods" and not rtype.group:
        mine: frozenset[str] | set[str] = POD_RESOURCES
    else:
        mine = {count_key(rtype)} | ({rtype.plural} if not rtype.group and rtype.plural in LEGACY_COUNTS else set())
    return sorted(k for k in hard if k in mine)


def missing(pod: Mapping[str, Any], required: Iterable[str]) -> str:
    """``podEvaluator.Constraints``: each container must state what a quota on cpu or memory
    counts; the message, or "" when none is missing."""
    required = VALIDATION & set(required)
    spec = pod.get("spec") or {}
    absent: dict[str, set[str]] = {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        requests, limits = _declared(container, "requests"), _declared(container, "limits")
        has = {f"requests.{n}" for n in requests} | set(requests) | {f"limits.{n}" for n in limits}
        for name in required - has:
            absent.setdefault(name, set()).add(str(container.get("name") or ""))
    return "; ".join(f"{name} for: {','.join(sorted(absent[name]))}" for name in sorted(absent))


def namespace_usage(
    keys: Iterable[str], objects: Callable[[str], Iterable[Mapping[str, Any]]], now: float
) -> dict[str, int]:
    """The namespace's usage of ``keys``; ``objects(plural)`` lists the namespace's objects."""
    out: dict[str, int] = {}
    pods: list[dict[str, int]] | None = None
    for key in keys:
        if key in POD_RESOURCES:
            if pods is None:
                pods = [pod_usage(p, now) for p in objects("pods")]
            out[key] = sum(u.get(key, 0) for u in pods)
            continue
        plural = key.removeprefix("count/").split(".", 1)[0]
        rtype = resources.BY_PLURAL.get(plural)
        if rtype is None or not (key == count_key(rtype) or (not rtype.group and key in LEGACY_COUNTS)):
            continue  # a resource nothing here counts
        out[key] = sum(1 for _ in objects(plural))
    return out


def _pretty(values: Mapping[str, int], hard: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={render(k, values.get(k, 0), hard.get(k))}" for k in sorted(values))


def admit(
    rtype: resources.ResourceType, obj: Obj, quotas: Iterable[Mapping[str, Any]],
    objects: Callable[[str], Iterable[Mapping[str, Any]]], now: float,
) -> None:
    """Refuse (403) a create that a quota of its namespace cannot hold."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    qualified = rtype.plural + (f".{rtype.group}" if rtype.group else "")
    details = {k: v for k, v in (("name", name), ("group", rtype.group), ("kind", rtype.plural)) if v}

    def forbidden(reason: str) -> errors.Forbidden:
        return errors.Forbidden(f'{qualified} "{name}" is forbidden: {reason}', **details)

    delta = usage(rtype, obj, now)
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        quota_name = quota["metadata"]["name"]
        hard = (quota.get("spec") or {}).get("hard") or {}
        keys = tracked(rtype, hard)
        if not keys:
            continue
        if rtype.plural == "pods" and not rtype.group:
            absent = missing(obj, keys)
            if absent:
                raise forbidden(f"failed quota: {quota_name}: must specify {absent}")
        known = (quota.get("status") or {}).get("hard") or {}
        if any(k not in known for k in keys):
            raise forbidden(f"status unknown for quota: {quota_name}, resources: {','.join(keys)}")
        requested = {k: delta[k] for k in keys if delta.get(k)}
        if not requested:
            continue
        used = namespace_usage(requested, objects, now)
        limits = {k: parse(k, hard[k]) for k in requested}
        exceeded = [k for k in requested if used.get(k, 0) + requested[k] > limits[k]]
        if exceeded:
            raise forbidden(
                f"exceeded quota: {quota_name}, requested: {_pretty({k: requested[k] for k in exceeded}, hard)}, "
                f"used: {_pretty({k: used.get(k, 0) for k in exceeded}, hard)}, "
                f"limited: {_pretty({k: limits[k] for k in exceeded}, hard)}"
            )
