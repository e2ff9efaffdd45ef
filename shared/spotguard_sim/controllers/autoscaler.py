"""Cluster Autoscaler with node groups (EKS managed node groups / Auto Scaling groups).

Every ``scanIntervalSeconds`` (10 s): when pods are unschedulable, the expander picks
one node group whose template node would hold some of them and the group grows by
the nodes they need (first-fit binpacking, at most to ``maxSize``); pods expected on
nodes still launching cause no other scale-up. A launch the cloud refuses
(``capacity.insufficientCapacity``) puts the group in backoff for 5 minutes, and
other groups are tried at the next scan. Otherwise, nodes below the utilization
threshold whose pods can all move elsewhere are unneeded; after
``scaleDownUnneededTime`` (10 min) unneeded, and not within
``scaleDownDelayAfterAdd`` (10 min) of a scale-up, they are removed (empty ones
together, at most 10; otherwise one at a time), never below ``minSize``: tainted
``ToBeDeletedByClusterAutoscaler:NoSchedule``, drained through the Eviction API
(a refused eviction retried every 10 s), terminated. A pod still not evicted after
``maxPodEvictionTime`` (2 min) fails the scale-down: the taint is removed, the node
stays, and no scale-down is tried for ``scaleDownDelayAfterFailure`` (3 min).
Pods annotated ``cluster-autoscaler.kubernetes.io/safe-to-evict:
"false"``, pods no controller owns, and kube-system pods without a
PodDisruptionBudget keep their node (FAQ "What types of pods can prevent CA from
removing a node?"). Expendable pods (``spec.priority`` below
``expendablePodsPriorityCutoff``, -10) are out of every simulation, as upstream leaves them
out of its cluster snapshot: no scale-up for them, no room taken, no utilization, never
moved or waited for by a drain; a pending pod nominated to an existing node (a preemptor
waiting for its victims) counts there and scales nothing up. Sources:
:mod:`spotguard_sim.nodegroups`, docs/sim.md.

Its requests go through one client, one token bucket of ``clusterAutoscaler.kubeClientQPS``
(5) and ``kubeClientBurst`` (10) (FAQ.md's parameters; main.go builds one clientset,
``kube_util.CreateKubeClient``, whose rest config ``GetKubeConfig`` gives those QPS and burst,
and the builder hands it to everything: ``NewAutoscalingKubeClients`` makes the event recorder
and the status ConfigMap's writer from that same client). Counted here: the
``ToBeDeletedByClusterAutoscaler`` taint's UPDATE (in the loop, before the drain: ``AddTaints``
writes from the snapshot's node, no GET) and its removal; each eviction, which waits for its
token as upstream's one goroutine a pod does, without holding up the loop (a refused one is
tried again ``EvictionRetryTime``, 10 s, later, with a new token); and, once every pod is
evicted, ``waitPodsToDisappear``'s GETs: every 5 s, each evicted pod in turn until one is still
on the node (core/scaledown/actuation/drain.go). The instances it launches and terminates are
the cloud's API (the Node's registration is the kubelet's, its deletion the cloud's). Not
counted, as the sim does not make them: the events it records (a ``ScaleDown`` event a pod
evicted, ``TriggeredScaleUp``...) and the status ConfigMap (a GET and an UPDATE a loop).

A scenario without node groups starts no thread.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

from spotguard_sim import billing, disruption, nodegroups, nodepools, nodestatus, pods, scenario, scheduler
from spotguard_sim import capacity as capacity_mod
from spotguard_sim import settings as settings_mod
from spotguard_sim.controllers import base, consolidation, provisioner, ratelimit, termination

LOOP = ("loop",)
TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
MAX_EMPTY_BULK_DELETE = 10
RETRY_SECONDS = nodegroups.EVICTION_RETRY_TIME
# core/scaledown/actuation/drain.go waitPodsToDisappear: the evicted pods are looked at again every 5 s
WAIT_SECONDS = 5.0
USER = {"username": "system:serviceaccount:kube-system:cluster-autoscaler", "groups": [
    "system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}


def blocks(store: Any, pod: dict[str, Any]) -> bool:
    """A pod that keeps its node from being scaled down."""
    meta = pod.get("metadata") or {}
    if (meta.get("annotations") or {}).get(SAFE_TO_EVICT) == "false":
        return True
    if base.controller_ref(pod) is None:
        return True
    return meta.get("namespace") == "kube-system" and not disruption.matching_pdbs(store, pod)


@dataclasses.dataclass
class _Drain:
    """A node's drain: its pods' turns at the client, and what waitPodsToDisappear looks at."""

    slots: dict[base.Key, float] = dataclasses.field(default_factory=dict)  # pod -> its eviction's token
    retry: dict[base.Key, float] = dataclasses.field(default_factory=dict)  # refused pod -> its next try
    evicted: list[base.Key] = dataclasses.field(default_factory=list)  # in order: what the GETs look at
    checked: int = 0  # the pass of GETs: how many of the evicted it found gone
    get_at: float | None = None  # when its next GET's token comes


class ClusterAutoscaler(base.Controller):
    name = "cluster-autoscaler"
    primary = ""

    def __init__(self, store: Any, informer: base.Informer, *, capacity: capacity_mod.Capacity,
                 seed: int | None = 0, limits: settings_mod.ClusterAutoscalerClient | None = None) -> None:
        super().__init__(store, informer)
        limits = limits or settings_mod.ClusterAutoscalerClient()
        self.client = ratelimit.TokenBucket(self.clock, limits.kube_client_qps, limits.kube_client_burst)
        self.capacity = capacity
        self.config = capacity.cluster_autoscaler
        self.groups = {g.name: g for g in self.config.node_groups}
        self.resync_seconds = self.config.scan_interval
        self.ledger = billing.of(store)
        self.rng = random.Random(seed)
        self.started = self.clock.now()
        self._launching: dict[str, tuple[nodegroups.NodeGroup, float]] = {}  # node -> group, Ready at
        self._expected: dict[base.Key, str] = {}
        self._last_scale_up = float("-inf")
        self._unneeded: dict[str, float] = {}
        self._deleting: dict[str, float] = {}  # node -> when its drain began
        self._drains: dict[str, _Drain] = {}
        self._last_failure = float("-inf")
        self._backoff: dict[str, float] = {}
        self._serial = 0
        self._desired = {g.name: g.min_size for g in self.config.node_groups}  # each ASG's desired capacity
        self._nominations: dict[str, list[dict[str, Any]]] = {}  # node -> pending pods nominated to it, per scan

    def start(self) -> None:
        if not self.groups:
            return
        for group in self.groups.values():
            for _ in range(group.min_size):
                self.store.create("nodes", self._node(group, self._zone(group), ready=True))
        self._spawn(self._work, f"{self.name}-0")
        self.queue.add(LOOP)

    def resync(self) -> None:
        return

    def sync(self, key: Any) -> None:
        if key == LOOP:
            try:
                self.run_once()
            finally:
                self.queue.add_after(LOOP, self.config.scan_interval)
        elif key[0] == "register":
            group, _ = self._launching[key[1]]
            with_taints = termination.registering(
                key[1], group.node_labels(key[1], key[2]), group.node_taints(), instance_type=group.instance_type,
                provider_id=f"aws:///{key[2]}/{scenario.instance_id(key[1])}", iso=self.clock.iso())
            self.store.create("nodes", with_taints)
        elif key[0] == "ready":
            iso = self.clock.iso()
            self.store.mutate("nodes", key[1], None, lambda n: termination.ready(n, iso))
            group, _ = self._launching[key[1]]
            self._launching[key[1]] = (group, self.clock.now())
        elif key[0] == "drain":
            self._drain(key[1])

    # ---- helpers -------------------------------------------------------------------

    def _members(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {name: [] for name in self.groups}
        for node in self.informer.list("nodes"):
            group = ((node.get("metadata") or {}).get("labels") or {}).get(nodegroups.NODEGROUP)
            if group in out:
                out[group].append(node)
        return out

    def _zone(self, group: nodegroups.NodeGroup) -> str:
        """The group's least-used zone (Auto Scaling groups balance their zones)."""
        used = Counter(((n.get("metadata") or {}).get("labels") or {}).get(nodepools.ZONE)
                       for n in self._members().get(group.name, []))
        return min(group.zones, key=lambda z: (used[z], z))

    def _node(self, group: nodegroups.NodeGroup, zone: str, *, ready: bool) -> dict[str, Any]:
        self._serial += 1
        name = f"ip-{nodestatus.internal_ip(f'{group.name}-{self._serial}').replace('.', '-')}.ec2.internal"
        t = group.instance_type
        node: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": group.node_labels(name, zone)},
            "spec": {"providerID": f"aws:///{zone}/{scenario.instance_id(name)}", "taints": group.node_taints()},
            "status": {"capacity": t.capacity(), "allocatable": t.allocatable()},
        }
        return nodestatus.fill(node) if ready else node

    def _expendable(self, pod: dict[str, Any]) -> bool:
        return nodegroups.expendable(pod, self.config.expendable_pods_priority_cutoff)

    def _nominated_to(self, pod: dict[str, Any]) -> str:
        """The existing node a pending pod is nominated to ("" if none)."""
        if (pod.get("spec") or {}).get("nodeName"):
            return ""
        node = str((pod.get("status") or {}).get("nominatedNodeName") or "")
        return node if node and self.informer.get("nodes", ("", node)) is not None else ""

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        """What the autoscaler's snapshot holds on ``node``: its pods and the pods nominated to
        it, the expendable ones left out (``FilterOutExpendablePods`` before ``SetClusterState``)."""
        bound = self.informer.pods_on_node(node)
        return [p for p in [*bound, *self._nominations.get(node, ())] if not self._expendable(p)]

    def _still_expected(self, key: base.Key) -> bool:
        node = self._expected.get(key)
        if node is None:
            return False
        launching = self._launching.get(node)
        window = 2 * self.config.scan_interval
        if launching is None or (launching[1] and self.clock.now() > launching[1] + window):
            self._expected.pop(key, None)
            return False
        return True

    # ---- the loop ------------------------------------------------------------------

    def run_once(self) -> None:
        now = self.clock.now()
        members = self._members()
        self._keep_desired(members, now)
        every = self.informer.list("pods")
        self._nominations = {}
        for p in every:
            if node := self._nominated_to(p):
                self._nominations.setdefault(node, []).append(p)
        pending = [p for p in every
                   if provisioner.unschedulable(p) and not self._expendable(p) and not self._nominated_to(p)
                   and not self._still_expected(base.key_of(p))]
        if pending:
            pending = nodegroups.not_schedulable_now(pending, self.informer.list("nodes"), self._pods_on)
        if pending and self._scale_up(pending, members, now):
            self._unneeded.clear()
            return
        if now - self._last_scale_up < self.config.scale_down.delay_after_add:
            self._unneeded.clear()
            return
        if now - self._last_failure < self.config.scale_down.delay_after_failure:
            return
        self._scale_down(members, now)

    def _keep_desired(self, members: dict[str, list[dict[str, Any]]], now: float) -> None:
        """The Auto Scaling group replaces instances it lost (a spot reclaim) to keep its desired capacity."""
        for name, group in self.groups.items():
            present = {n["metadata"]["name"] for n in members[name]}
            for node, (g, ready_at) in list(self._launching.items()):
                if g.name == name and ready_at and node not in present:
                    self._launching.pop(node, None)  # launched, joined, and gone since
            booting = sum(1 for node, (g, ready_at) in self._launching.items()
                          if g.name == name and not ready_at and node not in present)
            # A node being drained is still the group's running instance (the autoscaler takes it
            # out of the group only when it terminates it, ShouldDecrementDesiredCapacity): the
            # group does not replace it.
            missing = self._desired[name] - len(present) - booting
            if missing > 0:
                self.log.info("auto scaling group replaces lost instances", extra={"nodegroup": name,
                                                                                   "nodes": missing})
                self._launch(group, missing, now)

    def _launch(self, group: nodegroups.NodeGroup, count: int, now: float) -> list[str]:
        launched: list[str] = []
        for _ in range(count):
            zone = self._zone(group)
            if any(r.refuses(group.instance_type.name, group.capacity_type, zone, now - self.started)
                   for r in self.capacity.refusals):
                self.log.info("node group launch failed: backing off", extra={"nodegroup": group.name})
                self._backoff[group.name] = now + self.config.backoff
                break
            node = self._node(group, zone, ready=False)
            name = node["metadata"]["name"]
            low, high = self.capacity.launch_to_ready
            to_ready = self.rng.uniform(low, high)
            self._launching[name] = (group, 0.0)
            self.ledger.launch(name, group.instance_type.name, group.capacity_type, now)
            self.queue.add_after(("register", name, zone), to_ready * 2 / 3)
            self.queue.add_after(("ready", name), to_ready)
            launched.append(name)
        return launched

    def _scale_up(self, pending: list[dict[str, Any]], members: dict[str, list[dict[str, Any]]], now: float) -> bool:
        infos = sorted(((scheduler.PodInfo.from_pod(p), base.key_of(p)) for p in pending),
                       key=lambda x: (-x[0].requests.get("cpu", 0), x[1]))
        pods = [i for i, _ in infos]
        daemons = nodepools.daemon_pods(self.informer.list("daemonsets"))
        options = []
        for group in self.groups.values():
            if self._backoff.get(group.name, 0.0) > now:
                continue
            size = len({n["metadata"]["name"] for n in members[group.name]}
                       | {n for n, (g, _) in self._launching.items() if g.name == group.name})
            found = nodegroups.option(group, pods, group.max_size - size, daemons)
            if found is not None:
                options.append(found)
        chosen = nodegroups.expand(options, self.config.expander, self.rng)
        if chosen is None:
            return False
        group = chosen.group
        launched = self._launch(group, chosen.nodes, now)
        self._desired[group.name] += len(launched)
        if not launched:
            return False
        self.log.info("scale-up", extra={"nodegroup": group.name, "nodes": len(launched),
                                         "expander": self.config.expander})
        for n, index in enumerate(chosen.pods):
            self._expected[infos[index][1]] = launched[n % len(launched)]
        self._last_scale_up = now
        return True

    def _scale_down(self, members: dict[str, list[dict[str, Any]]], now: float) -> None:
        leaving = set(self._deleting)
        seen = set()
        for nodes in members.values():
            for node in nodes:
                name = node["metadata"]["name"]
                seen.add(name)
                starting = name in self._launching and not self._launching[name][1]
                if name in self._deleting or starting or not scheduler.node_ready(node):
                    continue
                info = scheduler.loaded(node, self._pods_on(name))
                if (nodegroups.utilization(info) < self.config.scale_down.utilization_threshold
                        and consolidation.can_move(self.store, self.informer, name, leaving,
                                                   blocks=lambda p: blocks(self.store, p), pods_on=self._pods_on)):
                    self._unneeded.setdefault(name, now)
                else:
                    self._unneeded.pop(name, None)
        for name in [n for n in self._unneeded if n not in seen]:
            self._unneeded.pop(name, None)
        ripe = sorted(n for n, since in self._unneeded.items() if now - since >= self.config.scale_down.unneeded_time)
        sizes = {g: len(nodes) - sum(1 for n in nodes if n["metadata"]["name"] in self._deleting)
                 for g, nodes in members.items()}
        empty_taken = 0
        for name in ripe:
            found = self.informer.get("nodes", ("", name))
            if found is None:
                continue
            group_name = found["metadata"]["labels"][nodegroups.NODEGROUP]
            if sizes[group_name] <= self.groups[group_name].min_size:
                continue
            if [p for p in consolidation.workload_pods(self.informer, name) if not self._expendable(p)]:
                if empty_taken or any(n not in self._unneeded for n in self._deleting):
                    continue
                self._delete(name)
                sizes[group_name] -= 1
                return
            if empty_taken >= MAX_EMPTY_BULK_DELETE:
                return
            self._delete(name)
            sizes[group_name] -= 1
            empty_taken += 1

    def _delete(self, name: str) -> None:
        self._deleting[name] = self.clock.now()
        self._unneeded.pop(name, None)
        self.log.info("scale-down: removing node", extra={"node": name})
        value = str(int(self.clock.now()))

        def taint(node: dict[str, Any]) -> None:
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TO_BE_DELETED]
            node.setdefault("spec", {})["taints"] = [*taints, {"key": TO_BE_DELETED, "value": value,
                                                                "effect": "NoSchedule"}]

        self.request()  # AddTaints: an UPDATE of the node as the loop's snapshot has it
        self.store.mutate("nodes", name, None, taint)
        self.queue.add(("drain", name))

    def _drain(self, name: str) -> None:
        """Evict the node's pods, each when its token comes (upstream's goroutine a pod waits at
        the client's limiter; this thread does not), a refused one again 10 s later; once all
        are evicted, waitPodsToDisappear: a pass GETs them in turn, each when its token comes,
        until one is still on the node, and the next pass is 5 s later; once a pass finds them
        all gone, the instance is terminated."""
        began = self._deleting.get(name)
        if began is None:
            return  # given up
        state = self._drains.setdefault(name, _Drain())
        now = self.clock.now()
        left = refused = 0
        wake: list[float] = []
        for pod in self.informer.pods_on_node(name):
            if self._expendable(pod) or not termination.drained(pod):
                continue
            left += 1
            key = base.key_of(pod)
            if pods.is_terminating(pod):
                state.slots.pop(key, None)
                if key not in state.evicted:
                    state.evicted.append(key)  # (going already: looked at as the evicted ones)
                continue
            retry = state.retry.get(key)
            if retry is not None and retry > now:
                refused += 1
                wake.append(retry)
                continue
            slot = state.slots.get(key)
            if slot is None:
                slot = state.slots[key] = now + self._turn()
            if slot > now:
                wake.append(slot)
                continue
            del state.slots[key]
            outcome = termination.evict(self.store, pod, USER, name)
            if outcome == termination.REFUSED:
                refused += 1
                state.retry[key] = now + RETRY_SECONDS
                wake.append(state.retry[key])
                continue
            state.retry.pop(key, None)
            if key not in state.evicted:
                state.evicted.append(key)
            if outcome == termination.GONE:
                left -= 1
        if left and refused and now - began >= self.config.scale_down.max_pod_eviction_time:
            self._give_up(name)
            return
        if wake:
            self.queue.add_after(("drain", name), min(wake) - now)
            return
        # every pod evicted: waitPodsToDisappear's pass, a GET a pod in turn
        while state.checked < len(state.evicted):
            if state.get_at is None:
                state.get_at = now + self._turn()
            if state.get_at > now:
                self.queue.add_after(("drain", name), state.get_at - now)
                return
            state.get_at = None
            found = self.informer.get("pods", state.evicted[state.checked])
            if found is not None and (found.get("spec") or {}).get("nodeName") == name:
                break  # still there
            state.checked += 1
        if left or state.checked < len(state.evicted):
            state.checked = 0
            self.queue.add_after(("drain", name), WAIT_SECONDS)
            return
        self._drains.pop(name, None)
        node = self.informer.get("nodes", ("", name)) or {}
        group_name = str(((node.get("metadata") or {}).get("labels") or {}).get(nodegroups.NODEGROUP) or "")
        # the cloud's API (TerminateInstanceInAutoScalingGroup); the Node's deletion is not the autoscaler's
        termination.terminate(self.store, name)
        if group_name in self._desired:
            self._desired[group_name] = max(self.groups[group_name].min_size, self._desired[group_name] - 1)
        self._deleting.pop(name, None)
        self._launching.pop(name, None)

    def _give_up(self, name: str) -> None:
        """A pod not evicted within maxPodEvictionTime: the scale-down failed; the node stays
        (its taint removed) and scale-down waits scaleDownDelayAfterFailure."""
        self.log.info("scale-down failed: pods not evicted in time, node kept", extra={"node": name})
        self._deleting.pop(name, None)
        self._drains.pop(name, None)
        self._last_failure = self.clock.now()

        def untaint(node: dict[str, Any]) -> None:
            node.setdefault("spec", {})["taints"] = [
                t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TO_BE_DELETED]

        self.request()  # CleanToBeDeleted: an UPDATE
        self.store.mutate("nodes", name, None, untaint)

    def _turn(self) -> float:
        """Take a token for a request that waits without holding up the loop (a goroutine of
        upstream's): the simulated seconds until it may go."""
        return self.client.reserve() if self.client is not None else 0.0
