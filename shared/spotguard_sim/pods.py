"""Pod helpers shared by the controllers and the eviction API (``disruption``):
k8s.io/kubernetes pkg/api/v1/pod and pkg/controller/controller_utils.go."""

from __future__ import annotations

import functools
import math
from typing import Any

from spotguard_sim import clock as simclock

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_PHASE_ORDER = {"Pending": 0, "Unknown": 1, "Running": 2}


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond  # type: ignore[no-any-return]
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    cond = condition(pod, "Ready")
    return bool(cond and cond.get("status") == "True")


def ready_since(pod: dict[str, Any]) -> float | None:
    cond = condition(pod, "Ready")
    if not cond or cond.get("status") != "True" or not cond.get("lastTransitionTime"):
        return None
    try:
        return simclock.parse_iso(cond["lastTransitionTime"])
    except ValueError:
        return None


def is_available(pod: dict[str, Any], min_ready_seconds: float, now: float) -> bool:
    """Ready for at least minReadySeconds (podutil.IsPodAvailable)."""
    if not is_ready(pod):
        return False
    if min_ready_seconds <= 0:
        return True
    since = ready_since(pod)
    return since is not None and since + min_ready_seconds <= now


def is_terminating(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_active(pod: dict[str, Any]) -> bool:
    """controller.IsPodActive: not terminal and not being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not is_terminating(pod)


def _created(pod: dict[str, Any]) -> float | None:
    ts = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return simclock.parse_iso(ts) if ts else None
    except ValueError:
        return None


def _deletion_cost(pod: dict[str, Any]) -> int:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(DELETION_COST)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def _max_restarts(pod: dict[str, Any]) -> int:
    return max(
        (int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []),
        default=0,
    )


def _log_rank_diff(t1: float, t2: float, now: float) -> int:
    """logarithmicRankDiff: compare log2 of the durations until now."""
    d1, d2 = (now - t1) * 1e9, (now - t2) * 1e9  # nanoseconds, as time.Duration
    r1 = int(math.log2(d1)) if d1 > 0 else -1
    r2 = int(math.log2(d2)) if d2 > 0 else -1
    return r1 - r2


def _after_or_zero(t1: float | None, t2: float | None) -> bool:
    """afterOrZero: zero times first, then the later time."""
    if t1 is None or t2 is None:
        return t1 is None
    return t1 > t2


def _less(a: tuple[dict[str, Any], int], b: tuple[dict[str, Any], int], now: float) -> bool:
    """ActivePodsWithRanks.Less (LogarithmicScaleDown and PodDeletionCost on, as by default)."""
    p1, rank1 = a
    p2, rank2 = b
    n1 = bool((p1.get("spec") or {}).get("nodeName"))
    n2 = bool((p2.get("spec") or {}).get("nodeName"))
    # 1. Unassigned < assigned
    if n1 != n2:
        return not n1
    # 2. PodPending < PodUnknown < PodRunning
    ph1 = _PHASE_ORDER.get((p1.get("status") or {}).get("phase", ""), 0)
    ph2 = _PHASE_ORDER.get((p2.get("status") or {}).get("phase", ""), 0)
    if ph1 != ph2:
        return ph1 < ph2
    # 3. Not ready < ready
    r1, r2 = is_ready(p1), is_ready(p2)
    if r1 != r2:
        return not r1
    # 4. lower pod-deletion-cost < higher
    c1, c2 = _deletion_cost(p1), _deletion_cost(p2)
    if c1 != c2:
        return c1 < c2
    # 5. Doubled up < not doubled up (more co-located related pods first)
    if rank1 != rank2:
        return rank1 > rank2
    uid1 = (p1.get("metadata") or {}).get("uid", "")
    uid2 = (p2.get("metadata") or {}).get("uid", "")
    # 6. Been ready for a shorter time < longer (log scale buckets)
    if r1 and r2:
        t1, t2 = ready_since(p1), ready_since(p2)
        if t1 != t2:
            return _newer_first(t1, t2, uid1, uid2, now)
    # 7. More container restarts < fewer
    m1, m2 = _max_restarts(p1), _max_restarts(p2)
    if m1 != m2:
        return m1 > m2
    # 8. Newer < older (log scale buckets)
    t1, t2 = _created(p1), _created(p2)
    if t1 != t2:
        return _newer_first(t1, t2, uid1, uid2, now)
    return False


def _newer_first(t1: float | None, t2: float | None, uid1: str, uid2: str, now: float) -> bool:
    """Upstream's time comparison: later first, in log-scale buckets, ties by uid."""
    if t1 is None or t2 is None:
        return _after_or_zero(t1, t2)
    diff = _log_rank_diff(t1, t2, now)
    if diff == 0:
        return bool(uid1 < uid2)
    return diff < 0


def deletion_order(pods: list[dict[str, Any]], ranks: list[int], now: float) -> list[dict[str, Any]]:
    """Pods sorted so the ones to delete first come first."""

    def cmp(a: tuple[dict[str, Any], int], b: tuple[dict[str, Any], int]) -> int:
        if _less(a, b, now):
            return -1
        if _less(b, a, now):
            return 1
        return 0

    ranked = sorted(zip(pods, ranks, strict=True), key=functools.cmp_to_key(cmp))
    return [p for p, _ in ranked]


def ranks_by_colocation(pods: list[dict[str, Any]], related: list[dict[str, Any]]) -> list[int]:
    """getPodsRankedByRelatedPodsOnSameNode: how many related active pods share the node."""
    per_node: dict[str, int] = {}
    for p in related:
        node = (p.get("spec") or {}).get("nodeName")
        if node and is_active(p):
            per_node[node] = per_node.get(node, 0) + 1
    return [per_node.get((p.get("spec") or {}).get("nodeName") or "", 0) for p in pods]


def set_condition(pod: dict[str, Any], kind: str, status: str, now_iso: str, *, reason: str = "",
                  message: str = "") -> bool:
    """Set a pod condition in place; lastTransitionTime changes only with the status."""
    conds = pod.setdefault("status", {}).setdefault("conditions", [])
    for cond in conds:
        if cond.get("type") == kind:
            changed = bool(cond.get("status") != status)
            if changed:
                cond["lastTransitionTime"] = now_iso
            if cond.get("reason", "") != reason or cond.get("message", "") != message:
                changed = True
            cond["status"] = status
            _set_opt(cond, "reason", reason)
            _set_opt(cond, "message", message)
            cond["lastProbeTime"] = None
            return changed
    cond = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": now_iso}
    _set_opt(cond, "reason", reason)
    _set_opt(cond, "message", message)
    conds.append(cond)
    return True


def _set_opt(d: dict[str, Any], key: str, value: str) -> None:
    if value:
        d[key] = value
    else:
        d.pop(key, None)
