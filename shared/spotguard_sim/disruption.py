"""policy/v1 Eviction and PodDisruptionBudget arithmetic.

``evict`` follows kube-apiserver's pods/eviction subresource
(pkg/registry/core/pod/storage/eviction.go):
https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/ and
https://kubernetes.io/docs/tasks/run-application/configure-pdb/ .
The budget check and the decrement of ``status.disruptionsAllowed`` happen
under the store lock, so two concurrent evictions cannot both use the last
allowed disruption.
"""

from __future__ import annotations

import logging
from typing import Any

from spotguard_sim import errors, intstr, pods, scheduler

MAX_DISRUPTED_POD_SIZE = 2000
DELETION_TIMEOUT_SECONDS = 120.0  # disruption controller's DeletionTimeout
log = logging.getLogger("spotguard.sim.eviction")


def pdb_selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    """policy/v1: an empty selector selects every pod of the namespace; null selects none."""
    spec = pdb.get("spec") or {}
    if "selector" not in spec or spec["selector"] is None:
        return False
    return scheduler.match_label_selector(spec["selector"], (pod.get("metadata") or {}).get("labels") or {})


def matching_pdbs(store: Any, pod: dict[str, Any]) -> list[dict[str, Any]]:
    ns = pod["metadata"].get("namespace", "default")
    items, _ = store.list("poddisruptionbudgets", namespace=ns)
    return [p for p in items if pdb_selects(p, pod)]


def desired_healthy(spec: dict[str, Any], pod_count: int, expected_scale: int | None) -> tuple[int, int]:
    """getExpectedPodCount: (expectedCount, desiredHealthy). ``expected_scale`` is the
    owning controllers' total scale (None when it cannot be found)."""
    if spec.get("maxUnavailable") is not None:
        if expected_scale is None:
            raise ValueError("found no controllers for the budget's pods")
        unavailable = intstr.scaled(spec["maxUnavailable"], expected_scale, True)
        return expected_scale, max(0, expected_scale - unavailable)
    if spec.get("minAvailable") is not None:
        value = spec["minAvailable"]
        if intstr.is_percent(value):
            if expected_scale is None:
                raise ValueError("found no controllers for the budget's pods")
            return expected_scale, intstr.scaled(value, expected_scale, True)
        return pod_count, intstr.scaled(value, pod_count, True)
    return pod_count, pod_count  # neither set: minAvailable defaults to 1 in older APIs


def _too_many(cause: str, retry_after_seconds: int) -> errors.TooManyRequests:
    """eviction.go: NewTooManyRequests with a DisruptionBudget cause (a retry after 10 s while
    the budget is not yet observed, none when it allows no disruption)."""
    return errors.too_many_requests(
        "Cannot evict pod as it would violate the pod's disruption budget.", retry_after_seconds,
        causes=[{"reason": "DisruptionBudget", "message": cause}],
    )


def _can_ignore_pdb(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or pods.is_terminating(pod)


def evict(store: Any, namespace: str, name: str, eviction_body: dict[str, Any],
          user: dict[str, Any] | None = None) -> None:
    """The pods/eviction subresource: delete the pod unless a webhook or a budget forbids it.

    The validating webhooks that cover ``pods/eviction`` are called first, outside the
    store lock (as kube-apiserver's createValidation, before the pod is read); a denial
    raises what the webhook said (429 included).
    Raises NotFound, BadRequest, TooManyRequests (429: the budget would be broken, or
    it was not yet observed), InternalError (500: more than one budget), Forbidden."""
    body = eviction_body or {}
    body_name = (body.get("metadata") or {}).get("name")
    if body_name and body_name != name:
        raise errors.BadRequest("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    dry_run = bool(options.get("dryRun"))
    grace = options.get("gracePeriodSeconds")
    preconditions = options.get("preconditions")
    chain = getattr(store, "admission", None)
    if getattr(store, "admission_enabled", False) and chain is not None:
        chain.validate_eviction(store, namespace, name, body, user=user, dry_run=dry_run)
    with store.lock:
        pod = store.get("pods", name, namespace)
        if not _can_ignore_pdb(pod):
            budgets = matching_pdbs(store, pod)
            if len(budgets) > 1:
                # eviction.go answers a bare Status (code 500, no reason, no details)
                refusal = errors.InternalError(
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support."
                )
                refusal.reason, refusal.with_details = "", False
                raise refusal
            if budgets:
                _check_and_decrement(store, budgets[0], pod, dry_run)
        log.info("evicting pod", extra={"namespace": namespace, "pod": name, "dry_run": dry_run})
        # (Where the caller's preconditions name a resourceVersion, left out: the write would move it.)
        if (not dry_run and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and not (preconditions or {}).get("resourceVersion")):
            # The DisruptionTarget condition before the delete (addConditionAndDeletePod in
            # pkg/registry/core/pod/storage/eviction.go): what a controller, or a what-if,
            # reads to tell an eviction from other deletions.
            now_iso = store.clock.iso()
            store.mutate("pods", name, namespace, lambda p: pods.set_condition(
                p, "DisruptionTarget", "True", now_iso, reason="EvictionByEvictionAPI",
                message="Eviction API: evicting"))  # fmt: skip
        store.delete("pods", name, namespace, dry_run=dry_run,
                     grace_period_seconds=None if grace is None else int(grace),
                     preconditions=preconditions)


def _check_and_decrement(store: Any, pdb: dict[str, Any], pod: dict[str, Any], dry_run: bool) -> None:
    spec = pdb.get("spec") or {}
    status = pdb.get("status") or {}
    pdb_name = pdb["metadata"]["name"]
    healthy = int(status.get("currentHealthy") or 0)
    desired = int(status.get("desiredHealthy") or 0)
    if not pods.is_ready(pod):
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return
        if healthy >= desired > 0:
            return  # IfHealthyBudget: an unready pod may go while the budget is healthy
    if int(status.get("observedGeneration") or 0) < int(pdb["metadata"].get("generation") or 1):
        raise _too_many(f"The disruption budget {pdb_name} is still being processed by the server.", 10)
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise errors.forbidden("poddisruptionbudget", pdb_name, "pdb disruptions allowed is negative", "policy")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_POD_SIZE:
        raise errors.forbidden(
            "poddisruptionbudget", pdb_name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller", "policy",
        )
    if allowed == 0:
        raise _too_many(
            f"The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently", 0,
        )
    if dry_run:
        return
    now_iso = store.clock.iso()
    pod_name = pod["metadata"]["name"]

    def decrement(obj: dict[str, Any]) -> None:
        st = obj.setdefault("status", {})
        st["disruptionsAllowed"] = int(st.get("disruptionsAllowed") or 0) - 1
        st.setdefault("disruptedPods", {})[pod_name] = now_iso
        if st["disruptionsAllowed"] == 0:
            for cond in st.get("conditions") or []:
                if cond.get("type") == "DisruptionAllowed" and cond.get("status") != "False":
                    cond.update(status="False", reason="InsufficientPods", lastTransitionTime=now_iso)

    store.mutate("poddisruptionbudgets", pdb_name, pdb["metadata"]["namespace"], decrement)
