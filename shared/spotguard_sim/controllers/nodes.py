"""Node lifecycle (kube-controller-manager's pkg/controller/nodelifecycle), as upstream.

A node whose instance runs reports Ready, as its kubelet posting status would
(``nodestatus.post_ready``). When the instance goes (see
:mod:`spotguard_sim.cloud`), nothing changes in the API at first: the pods keep
their Ready condition while they no longer serve. ``monitorNodeHealth`` runs
every ``--node-monitor-period``; once no status has come for
``--node-monitor-grace-period`` it sets the node's conditions to Unknown
("Kubelet stopped posting node status."), marks its pods not Ready
(MarkPodsNotReady), and taints it ``node.kubernetes.io/unreachable:NoSchedule``
at once and ``node.kubernetes.io/unreachable:NoExecute`` through the per-zone
rate-limited tainter: ``--node-eviction-rate`` nodes a second in a healthy zone,
``--secondary-node-eviction-rate`` (0 in zones of at most
``--large-cluster-size-threshold`` nodes) when at least
``--unhealthy-zone-threshold`` of more than two nodes are not Ready, and none at
all while every zone is fully disrupted. A node reporting Ready=False gets the
``not-ready`` taints instead; a Ready node loses them.

Its requests go through its own client's token bucket (``--kube-api-qps`` 20, burst 30;
``ClientOrDie("node-controller")`` in cmd/kube-controller-manager/app/core.go): a node's
status update (``tryUpdateNodeHealth``), a GET and a PATCH for each taint change
(``AddOrUpdateTaintOnNode``, ``RemoveTaintOffNode``), one status update per pod marked not
Ready (``MarkPodsNotReady``, pkg/controller/util/node/controller_utils.go). The status the
kubelet would post (a node's first Ready, its nodeInfo) is the kubelet's, not limited here.
https://kubernetes.io/docs/concepts/architecture/nodes/#node-controller
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from spotguard_sim import cloud as cloud_mod
from spotguard_sim import errors, nodestatus, pods, settings
from spotguard_sim.controllers import base, instances

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
CONDITION_TAINTS = (NOT_READY, UNREACHABLE)
TERMINATE_AT = instances.TERMINATE_AT  # kept for importers of the old names
terminate_at = instances.terminate_at


def ready_status(node: dict[str, Any]) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return None


def zone_of(node: dict[str, Any]) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return f"{labels.get('topology.kubernetes.io/region', '')}:\x00:{labels.get('topology.kubernetes.io/zone', '')}"


def _taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _set_unknown(node: dict[str, Any], now: str) -> None:
    """tryUpdateNodeHealth: every condition the kubelet owns becomes Unknown."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "Unknown":
            continue
        cond.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                    lastTransitionTime=now)


class NodeLifecycleController(base.Controller):
    name = "node-lifecycle-controller"
    primary = "nodes"
    resync_seconds = 10.0

    def __init__(self, store: Any, informer: base.Informer, *, node_loss: settings.NodeLoss | None = None,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.use_client(limits or settings.ControllerManager())
        self.node_loss = node_loss or settings.NodeLoss()
        self.cloud = cloud_mod.of(store)
        self._next_taint: dict[str, float] = {}  # zone -> earliest time of its next NoExecute taint
        self._zone_lock = threading.Lock()
        self.cloud.subscribe(self._instance_changed)

    def stop(self) -> None:
        self.cloud.unsubscribe(self._instance_changed)
        super().stop()

    def _instance_changed(self, node: str, state: str, when: float) -> None:
        self.queue.add(("", node))

    def sync(self, key: Any) -> None:
        _, name = key
        node = self.informer.get("nodes", key)  # the lister, as upstream's monitorNodeHealth
        if node is None:
            return
        now = self.clock.now()
        noticed = self._noticed(name)
        if noticed is not None:
            if now < noticed:
                self.queue.add_after(key, noticed - now)
                return
            if ready_status(node) != "Unknown":
                self.log.info("node stopped posting status: Unknown", extra={"node": name})
                iso = self.clock.iso()
                self.request()  # UpdateStatus
                node = self.store.mutate("nodes", name, None, lambda n: _set_unknown(n, iso))
        elif ready_status(node) is None:
            iso = self.clock.iso()
            self.store.mutate("nodes", name, None, lambda n: nodestatus.post_ready(n, iso))
            return
        elif not nodestatus.complete(node):
            self.store.mutate("nodes", name, None, nodestatus.fill)  # what its kubelet reports
            return
        status = ready_status(node)
        if status == "True":
            if any(t.get("key") in CONDITION_TAINTS for t in _taints(node)):
                self._set_taints(name, None)
            return
        condition_taint = UNREACHABLE if status in ("Unknown", None) else NOT_READY
        self._mark_pods_not_ready(name)
        has_no_execute = any(t.get("key") == condition_taint and t.get("effect") == "NoExecute" for t in _taints(node))
        has_no_schedule = any(t.get("key") == condition_taint and t.get("effect") == "NoSchedule"
                              for t in _taints(node))
        if not has_no_schedule:
            self._set_taints(name, condition_taint, no_execute=has_no_execute)
        if has_no_execute and self._every_zone_fully_disrupted(now):
            self.log.info("every zone is fully disrupted: no NoExecute taints", extra={"node": name})
            self._set_taints(name, condition_taint)  # markNodeAsReachable
            self.queue.add_after(key, self.node_loss.node_monitor_period)
        elif not has_no_execute:
            wait = self._tainter_wait(node, now)
            if wait is None:
                self.queue.add_after(key, self.node_loss.node_monitor_period)
            elif wait > 0:
                self.queue.add_after(key, wait)
            else:
                self.log.info("tainting node NoExecute", extra={"node": name, "taint": condition_taint})
                self._set_taints(name, condition_taint, no_execute=True)

    def _noticed(self, name: str) -> float | None:
        """When the monitor pass notices that the node's kubelet stopped (None: it runs)."""
        found = self.cloud.instance(name)
        if found is None or found.lost is None:
            return None
        return instances.next_tick(found.lost + self.node_loss.node_monitor_grace_period,
                                   self.node_loss.node_monitor_period)

    def _zone_states(self, now: float) -> dict[str, tuple[int, int]]:
        """(ready, not ready) nodes per zone, as one monitor pass sees them after updating every node."""
        states: dict[str, tuple[int, int]] = {}
        for other in self.informer.list("nodes"):
            ready, not_ready = states.get(zone_of(other), (0, 0))
            noticed = self._noticed(other["metadata"]["name"])
            if ready_status(other) == "True" and (noticed is None or noticed > now):
                ready += 1
            else:
                not_ready += 1
            states[zone_of(other)] = (ready, not_ready)
        return states

    def _every_zone_fully_disrupted(self, now: float) -> bool:
        states = self._zone_states(now)
        return bool(states) and all(r == 0 and n > 0 for r, n in states.values())

    def _tainter_wait(self, node: dict[str, Any], now: float) -> float | None:
        """Seconds until the zone's tainter may taint this node (0: now); None: not while the zone is so."""
        zone = zone_of(node)
        states = self._zone_states(now)
        ready, not_ready = states.get(zone, (0, 1))
        full = {z for z, (r, n) in states.items() if r == 0 and n > 0}
        loss = self.node_loss
        if states and len(full) == len(states):
            return None  # every zone fully disrupted: "master disruption mode", no evictions
        if zone in full:
            rate = loss.node_eviction_rate
        elif not_ready > 2 and not_ready / (ready + not_ready) >= loss.unhealthy_zone_threshold:
            rate = 0.0 if ready + not_ready <= loss.large_cluster_size_threshold else loss.secondary_node_eviction_rate
        else:
            rate = loss.node_eviction_rate
        if rate <= 0:
            return None
        with self._zone_lock:
            at = self._next_taint.get(zone, 0.0)
            if now < at:
                return at - now
            self._next_taint[zone] = now + 1.0 / rate  # a token bucket of burst 1
            return 0.0

    def _set_taints(self, name: str, key: str | None, *, no_execute: bool = False) -> None:
        """Leave only the condition taint ``key`` (NoSchedule, and NoExecute when asked); None clears them."""
        iso = self.clock.iso()

        def edit(node: dict[str, Any]) -> None:
            old = _taints(node)
            keep = [t for t in old if t.get("key") not in CONDITION_TAINTS]
            if key is not None:
                wanted = ["NoSchedule", "NoExecute"] if no_execute else ["NoSchedule"]
                for effect in wanted:
                    same = next((t for t in old if t.get("key") == key and t.get("effect") == effect), None)
                    keep.append(same or {"key": key, "effect": effect, "timeAdded": iso})
            spec = node.setdefault("spec", {})
            if keep:
                spec["taints"] = keep
            else:
                spec.pop("taints", None)

        with contextlib.suppress(errors.NotFound):
            self.write("nodes", name, None, edit, read_first=True)  # GET (resourceVersion 0), PATCH

    def _mark_pods_not_ready(self, node_name: str) -> None:
        """MarkPodsNotReady (pkg/controller/util/node): the Ready condition turns False."""
        now = self.clock.iso()
        for p in self.informer.pods_on_node(node_name):
            if not pods.is_ready(p):
                continue

            def edit(pod: dict[str, Any]) -> None:
                cond = pods.condition(pod, "Ready")
                if cond is not None and cond.get("status") != "False":
                    cond.update(status="False", lastTransitionTime=now)

            with contextlib.suppress(errors.NotFound):
                self.request()  # UpdateStatus
                self.store.mutate("pods", p["metadata"]["name"], p["metadata"]["namespace"], edit)
