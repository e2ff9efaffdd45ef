"""The cloud's side of losing a node.

``Reclaimer`` plays the cloud provider: a node annotated
``sim.spotguard.io/terminate-at: <RFC3339>`` loses its instance at that
simulated time, by the action in ``sim.spotguard.io/instance-action``
(terminate, stop or hibernate; the scenario's ``nodeLoss.instanceAction`` when
absent). Nothing changes in the API then: the kubelet just stops. A terminated
instance is ``shutting-down`` first and ``terminated`` only
``nodeLoss.shuttingDownSeconds`` later, as EC2's.

``CloudNodeLifecycleController`` is cloud-controller-manager's node lifecycle
controller (k8s.io/cloud-provider controllers/nodelifecycle
node_lifecycle_controller.go, ``MonitorNodes`` every ``--node-monitor-period``):
for every Node whose Ready condition is not True, a Node whose instance no
longer exists (InstanceExistsByProviderID false: terminated, not shutting-down,
kubernetes/cloud-provider-aws pkg/providers/v1/aws.go) is deleted; one whose
instance is shut down (InstanceShutdownByProviderID: stopped, hibernated) gets the
``node.cloudprovider.kubernetes.io/shutdown:NoSchedule`` taint, removed again when
the node is Ready. A node it left alone is looked at again at the first tick after
its instance changes state. Its requests (a Node's DELETE; a GET and a PATCH for each
taint change) go through its own client's token bucket: cloud-controller-manager's
``--kube-api-qps`` 20 and ``--kube-api-burst`` 30 (k8s.io/cloud-provider config/v1alpha1
defaults.go), the simulated cluster's ``controllerManager`` settings.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import cloud as cloud_mod
from spotguard_sim import errors, scheduler, settings
from spotguard_sim.controllers import base

TERMINATE_AT = "sim.spotguard.io/terminate-at"
INSTANCE_ACTION = "sim.spotguard.io/instance-action"
SHUTDOWN_TAINT = {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"}


def annotated_time(node: dict[str, Any], key: str) -> float | None:
    """The time (epoch seconds) in ``node``'s annotation ``key``; None without one, or an unreadable one."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
    if not raw:
        return None
    try:
        return simclock.parse_iso(str(raw))
    except ValueError:
        return None


def terminate_at(node: dict[str, Any]) -> float | None:
    return annotated_time(node, TERMINATE_AT)


def next_tick(now: float, period: float) -> float:
    """The first run of a loop with ``period`` at or after ``now`` (loops tick on a fixed grid)."""
    if period <= 0:
        return now
    return math.ceil(now / period - 1e-9) * period


class Reclaimer(base.Controller):
    name = "cloud-reclaimer"
    primary = "nodes"
    resync_seconds = 30.0

    def __init__(self, store: Any, informer: base.Informer, *, node_loss: settings.NodeLoss) -> None:
        super().__init__(store, informer)
        self.node_loss = node_loss
        self.cloud = cloud_mod.of(store)

    def sync(self, key: Any) -> None:
        _, name = key
        now = self.clock.now()
        found = self.cloud.instance(name)
        if found is not None and found.state == cloud_mod.SHUTTING_DOWN:
            done = found.since + self.node_loss.shutting_down_seconds
            if now < done:
                self.queue.add_after(key, done - now)
            else:
                self.log.info("instance terminated", extra={"node": name})
                self.cloud.set_state(name, cloud_mod.TERMINATED, done)
            return
        node = self.informer.get("nodes", key)
        if node is None:
            return
        when = terminate_at(node)
        if when is None or not self.cloud.running(name):
            return
        if now < when:
            self.queue.add_after(key, when - now)
            return
        action = ((node.get("metadata") or {}).get("annotations") or {}).get(INSTANCE_ACTION)
        if action not in settings.INSTANCE_ACTIONS:
            action = self.node_loss.instance_action
        self.log.info("instance lost: the kubelet stops", extra={"node": name, "action": action})
        state = cloud_mod.STATE_OF_ACTION[action]
        self.cloud.set_state(name, state, when)
        if state == cloud_mod.SHUTTING_DOWN:
            self.queue.add_after(key, max(0.0, when + self.node_loss.shutting_down_seconds - now))


class CloudNodeLifecycleController(base.Controller):
    name = "cloud-node-lifecycle-controller"
    primary = "nodes"
    resync_seconds = 30.0

    def __init__(self, store: Any, informer: base.Informer, *, node_loss: settings.NodeLoss,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.use_client(limits or settings.ControllerManager())
        self.period = node_loss.cloud_node_monitor_period
        self.cloud = cloud_mod.of(store)
        self.cloud.subscribe(self._instance_changed)

    def stop(self) -> None:
        self.cloud.unsubscribe(self._instance_changed)
        super().stop()

    def _instance_changed(self, node: str, state: str, when: float) -> None:
        """MonitorNodes asks the cloud on every tick: a change is seen at the next one."""
        now = self.clock.now()
        self.queue.add_after(("", node), next_tick(now, self.period) - now)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "nodes" or event_type == "DELETED":
            return
        if not scheduler.node_ready(obj) or _has_shutdown_taint(obj):
            now = self.clock.now()
            self.queue.add_after(base.key_of(obj), next_tick(now, self.period) - now)

    def sync(self, key: Any) -> None:
        _, name = key
        node = self.informer.get("nodes", key)  # the lister, as upstream's
        if node is None:
            return
        if scheduler.node_ready(node):
            if _has_shutdown_taint(node):
                self._taint(name, add=False)
            return
        if not self.cloud.exists(name):
            self.log.info("deleting node since it is no longer present in cloud provider",
                          extra={"node": name})
            with contextlib.suppress(errors.NotFound):
                self.request()
                self.store.delete("nodes", name)
            return
        if self.cloud.shut_down(name) and not _has_shutdown_taint(node):
            self._taint(name, add=True)

    def _taint(self, name: str, *, add: bool) -> None:
        now = self.clock.iso()

        def edit(node: dict[str, Any]) -> None:
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("key") != SHUTDOWN_TAINT["key"]]
            if add:
                taints.append({**SHUTDOWN_TAINT, "timeAdded": now})
            spec = node.setdefault("spec", {})
            if taints:
                spec["taints"] = taints
            else:
                spec.pop("taints", None)

        with contextlib.suppress(errors.NotFound):
            self.write("nodes", name, None, edit, read_first=True)  # GET, PATCH


def _has_shutdown_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == SHUTDOWN_TAINT["key"] for t in (node.get("spec") or {}).get("taints") or [])
