"""What node autoscalers share when they take a node away, and when they bring one.

``drain`` evicts a node's pods through the Eviction API (DaemonSet and mirror pods
stay; PodDisruptionBudgets answer 429) and says how many are left; ``terminate``
ends the instance and deletes the Node. ``registering`` is a Node as a launched
instance's kubelet registers it: NotReady, tainted
``node.kubernetes.io/not-ready:NoSchedule`` (the CNI is not up yet); ``ready`` posts
Ready, as its kubelet does once the network is up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from spotguard_sim import catalogue, disruption, errors, nodestatus, pods
from spotguard_sim import cloud as cloud_mod
from spotguard_sim.controllers import base, drainer

log = logging.getLogger("spotguard.sim.termination")
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
NETWORK_NOT_READY = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                     "message:Network plugin returns error: cni plugin not initialized")


EVICTED, GONE, REFUSED = "evicted", "gone", "refused"


def drained(pod: dict[str, Any]) -> bool:
    """A pod a drain moves off its node: not a DaemonSet or mirror pod, not finished."""
    ref = base.controller_ref(pod) or {}
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    if ref.get("kind") == "DaemonSet" or drainer.MIRROR in notes:
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def evict(store: Any, pod: dict[str, Any], user: Mapping[str, Any], node: str = "") -> str:
    """One eviction through the Eviction API: EVICTED, GONE (the pod no longer exists) or
    REFUSED (a budget's 429, a webhook's denial: the caller tries again)."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    try:
        disruption.evict(store, ns, name, {"apiVersion": "policy/v1", "kind": "Eviction",
                                           "metadata": {"name": name, "namespace": ns}}, user=dict(user))
    except errors.NotFound:
        return GONE
    except errors.StatusError as exc:
        log.info("eviction refused, will retry", extra={"node": node, "pod": name, "code": exc.code})
        return REFUSED
    return EVICTED


def drain(store: Any, informer: base.Informer, node: str, user: Mapping[str, Any],
          keep: Callable[[dict[str, Any]], bool] | None = None, *,
          skip: Callable[[dict[str, Any]], bool] | None = None,
          request: Callable[[], None] | None = None) -> tuple[int, int]:
    """Evict what runs on ``node``; (pods left, evictions refused). A pod ``keep`` is true of
    is not evicted but waited for (Karpenter's do-not-disrupt pods: IsEvictable, IsDrainable);
    one ``skip`` is true of is neither evicted nor waited for (the Cluster Autoscaler's
    expendable pods: they go with the node). ``request`` is called before each eviction: it
    waits until the caller's client lets the request go."""
    left = refused = 0
    for pod in informer.pods_on_node(node):
        if (skip is not None and skip(pod)) or not drained(pod):
            continue
        left += 1
        if pods.is_terminating(pod) or (keep is not None and keep(pod)):
            continue
        if request is not None:
            request()
        outcome = evict(store, pod, user, node)
        if outcome == GONE:
            left -= 1
        elif outcome == REFUSED:
            refused += 1
    return left, refused


def terminate(store: Any, node: str) -> None:
    """The instance ends now (billing stops) and its Node is deleted."""
    cloud_mod.of(store).set_state(node, cloud_mod.TERMINATED, store.clock.now())
    with contextlib.suppress(errors.NotFound):
        store.delete("nodes", node)


def registering(name: str, labels: Mapping[str, str], taints: list[dict[str, Any]], *,
                instance_type: catalogue.InstanceType, provider_id: str, iso: str,
                owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"providerID": provider_id, "taints": [*taints, dict(NOT_READY_TAINT)]},
        "status": {"capacity": instance_type.capacity(), "allocatable": instance_type.allocatable(),
                   "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                   "message": NETWORK_NOT_READY, "lastHeartbeatTime": iso,
                                   "lastTransitionTime": iso}]},
    }
    if owners:
        node["metadata"]["ownerReferences"] = owners
    return nodestatus.fill(node)


def ready(node: dict[str, Any], iso: str) -> None:
    nodestatus.post_ready(node, iso)
