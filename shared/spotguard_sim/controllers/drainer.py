"""A drainer that reacts to a spot notice at once, as aws-node-termination-handler
does: cordon the node, then evict every pod except DaemonSet and mirror pods
through the Eviction API's logic (validating webhooks on pods/eviction, then the
budgets), retrying a refused eviction (429, from a budget or a webhook) every 5
simulated seconds, as kubectl drain does, until the node is gone.
https://github.com/aws/aws-node-termination-handler (cordon and drain with
kubectl's drain library; https://kubernetes.io/docs/tasks/administer-cluster/safely-drain-node/)
"""

from __future__ import annotations

from typing import Any

from spotguard_sim import disruption, errors, pods
from spotguard_sim.controllers import base, instances, nodes

RETRY_SECONDS = 5.0  # kubectl drain waits 5 s before evicting again after a 429
USER = {"username": "system:serviceaccount:kube-system:aws-node-termination-handler",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
MIRROR = "kubernetes.io/config.mirror"
# When the drainer starts on a node marked for reclaim (RFC3339; default: at once). Tests
# and benchmarks set it to play a drainer that acts a moment after the notice.
DRAIN_AT = "sim.spotguard.io/drain-at"


def drainable(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    if MIRROR in (meta.get("annotations") or {}):
        return False
    ref = base.controller_ref(pod)
    if ref and ref.get("kind") == "DaemonSet":
        return False
    return not pods.is_terminating(pod)


def _drain_at(node: dict[str, Any]) -> float | None:
    return instances.annotated_time(node, DRAIN_AT)


class Drainer(base.Controller):
    name = "drainer"
    primary = "nodes"
    resync_seconds = 10.0

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes" and event_type != "DELETED" and nodes.terminate_at(obj) is not None:
            self.queue.add(base.key_of(obj))

    def resync(self) -> None:
        for node in self.informer.list("nodes"):
            if nodes.terminate_at(node) is not None:
                self.queue.add(base.key_of(node))

    def sync(self, key: Any) -> None:
        _, name = key
        try:
            node = self.store.get("nodes", name)
        except errors.NotFound:
            return
        if nodes.terminate_at(node) is None:
            return
        start = _drain_at(node)
        if start is not None and self.clock.now() < start:
            self.queue.add_after(key, start - self.clock.now())
            return
        if not (node.get("spec") or {}).get("unschedulable"):
            self.log.info("drainer: cordoning node", extra={"node": name})

            def cordon(obj: dict[str, Any]) -> None:
                obj.setdefault("spec", {})["unschedulable"] = True

            self.store.mutate("nodes", name, None, cordon)
        refused = 0
        for pod in self.informer.pods_on_node(name):
            if not drainable(pod):
                continue
            ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            try:
                disruption.evict(self.store, ns, pod_name, {
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod_name, "namespace": ns}}, user=USER)
                self.log.info("drainer: evicted pod", extra={"node": name, "namespace": ns,
                                                              "pod": pod_name})
            except errors.NotFound:
                continue
            except errors.StatusError as exc:
                refused += 1
                self.log.info("drainer: eviction refused, will retry", extra={
                    "node": name, "namespace": ns, "pod": pod_name, "code": exc.code,
                    "error": exc.message})
        if refused:
            self.queue.add_after(key, RETRY_SECONDS)
