"""On-demand headroom: how much on-demand room low-priority placeholder pods hold so that
the surge of an interruption notice schedules at once. Pure; no I/O.

The overprovisioning pattern (kubernetes.io, "Overprovision Node Capacity For A Cluster"):
pods of a negative PriorityClass hold room; a pod of higher priority that finds no room
preempts them (the scheduler evicts them at once, no Eviction API), and they go Pending
until the node autoscaler has launched room for them again. spotguard sizes them to the
surge a notice would ask for, and node-added keeps a Deployment of them at that size
(:mod:`spotguard.nodeadded.headroom`).

What is at risk: at a notice for a spot node, spot-interruption surges every Deployment
with pods on it by as many on-demand replicas as it has pods there (the promise: no
Deployment serves fewer than before the notice), so every active pod of a managed,
enabled Deployment on a spot node is covered, not only the ones its floor needs.
StatefulSets are not: they do not surge (their floor keeps a quorum on on-demand, and
their spot replica is made again after the reclaim), nor are nodes already under a notice
(their surge is written: the room the placeholders held went to it, and those pods are
gone within two minutes).

The cover (``Config.headroom``):

- ``off`` (the default: headroom is on-demand capacity billed while nothing uses it);
- ``largest-node``: the surge of the one spot node whose reclaim needs the most
  placeholders (spot nodes are often reclaimed one at a time);
- ``all-spot``: every spot node at once (a whole spot pool reclaimed).

Size: each placeholder requests the largest CPU request and the largest memory request
of the pods at risk (whichever pod they come from), so a preempted placeholder frees room
for any one of them; the count makes count x size cover the summed requests of the cover
in both resources. A pod's room is its effective requests (``quantities.pod_requests``);
a request missing, zero, negative or unreadable counts as zero (the scheduler fits such
a pod anywhere it has a pod slot: it needs no room held). Only CPU and memory are held
(a pod asking for GPUs needs a node with GPUs, which a pause pod cannot stand in for).
The count never exceeds ``Config.headroom_max_pods``, so a misconfiguration (or a huge
spot pool with ``all-spot``) cannot launch a fleet; ``capped`` says when it was cut.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spotguard.policy.capacity import Capacity
from spotguard.policy.config import HEADROOM_IMAGE, HEADROOM_MAX_PODS, Config, HeadroomCover
from spotguard.policy.state import WorkloadState
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, Kind

CPU = "cpu"
MEMORY = "memory"
# The names of what node-added keeps (a Deployment in spotguard's namespace, its pods'
# PriorityClass, shipped as a static manifest) and the label its pods carry.
NAME = "spotguard-headroom"
PRIORITY_CLASS = NAME
PRIORITY = -10
LABEL = "spotguard.io/headroom"
# What the headroom covers (the setting's values; defined with the settings).
Cover = HeadroomCover
DEFAULT_IMAGE = HEADROOM_IMAGE
DEFAULT_MAX_PODS = HEADROOM_MAX_PODS


@dataclass(frozen=True)
class Headroom:
    """The placeholders wanted: ``count`` pods of ``cpu`` millicores and ``memory`` bytes each."""

    cover: Cover
    count: int = 0
    cpu: int = 0  # millicores, per placeholder
    memory: int = 0  # bytes, per placeholder
    wanted: int = 0  # the count before the cap (Config.headroom_max_pods)
    pods: int = 0  # pods at risk that the cover counts
    need_cpu: int = 0  # their summed requests
    need_memory: int = 0
    nodes: tuple[str, ...] = ()  # the spot nodes covered (largest-node: the one)

    @property
    def capped(self) -> bool:
        return self.wanted > self.count

    @property
    def held_cpu(self) -> int:
        return self.count * self.cpu

    @property
    def held_memory(self) -> int:
        return self.count * self.memory

    def describe(self) -> str:
        if self.cover is Cover.OFF:
            return "headroom off"
        if not self.count:
            return f"headroom {self.cover}: nothing at risk"
        text = (
            f"headroom {self.cover}: {self.count} placeholder(s) of {self.cpu}m CPU and "
            f"{_mib(self.memory)} MiB for {self.pods} pod(s) at risk ({self.need_cpu}m, "
            f"{_mib(self.need_memory)} MiB) on {', '.join(self.nodes)}"
        )
        if self.capped:
            text += f"; capped at {self.count} of the {self.wanted} wanted (headroom-max-pods)"
        return text


@dataclass(frozen=True)
class AtRisk:
    """The requests of the pods on one spot node that a notice for it would surge."""

    node: str
    requests: tuple[tuple[int, int], ...] = field(default=())  # (cpu millicores, memory bytes) per pod

    @property
    def cpu(self) -> int:
        return sum(c for c, _ in self.requests)

    @property
    def memory(self) -> int:
        return sum(m for _, m in self.requests)


def room(requests: Mapping[str, int]) -> tuple[int, int]:
    """(CPU millicores, memory bytes) a pod's requests hold; absent or negative: 0."""
    return max(int(requests.get(CPU, 0) or 0), 0), max(int(requests.get(MEMORY, 0) or 0), 0)


def at_risk(
    nodes: Sequence[NodeView], states: Iterable[WorkloadState], capacity_of: Mapping[str, Capacity]
) -> list[AtRisk]:
    """Per spot node (not under a notice already), the requests of the pods a notice for it
    would surge: the active pods of managed, enabled Deployments. Nodes with none are left out."""
    spot = {
        n.name
        for n in nodes
        if capacity_of.get(n.name) is Capacity.SPOT and not any(t.key == INTERRUPTION_TAINT for t in n.taints)
    }
    found: dict[str, list[tuple[int, int]]] = {}
    for state in states:
        if state.workload.kind is not Kind.DEPLOYMENT or not state.floor.enabled:
            continue
        for pod in state.pods:
            if pod.active and pod.node_name in spot:
                found.setdefault(pod.node_name, []).append(room(pod.requests))
    return [AtRisk(name, tuple(reqs)) for name, reqs in sorted(found.items())]


def size(cover: Cover, risks: Sequence[AtRisk], max_pods: int) -> Headroom:
    """The placeholders that hold room for the surge of ``cover`` over ``risks``."""
    if cover is Cover.OFF:
        return Headroom(cover)
    every = [r for risk in risks for r in risk.requests]
    cpu = max((c for c, _ in every), default=0)
    memory = max((m for _, m in every), default=0)
    if not cpu and not memory:
        return Headroom(cover, cpu=cpu, memory=memory, pods=len(every))

    def count(risk_cpu: int, risk_memory: int) -> int:
        return max(
            math.ceil(risk_cpu / cpu) if cpu else 0,
            math.ceil(risk_memory / memory) if memory else 0,
        )

    if cover is Cover.LARGEST_NODE:
        # The node whose surge needs the most placeholders (then the most CPU, memory, name).
        chosen = [max(risks, key=lambda r: (count(r.cpu, r.memory), r.cpu, r.memory, r.node))]
    else:
        chosen = list(risks)
    need_cpu = sum(r.cpu for r in chosen)
    need_memory = sum(r.memory for r in chosen)
    wanted = count(need_cpu, need_memory)
    return Headroom(
        cover,
        count=min(wanted, max(max_pods, 0)),
        cpu=cpu,
        memory=memory,
        wanted=wanted,
        pods=sum(len(r.requests) for r in chosen),
        need_cpu=need_cpu,
        need_memory=need_memory,
        nodes=tuple(r.node for r in chosen),
    )


def wanted(config: Config, nodes: Sequence[NodeView], states: Iterable[WorkloadState]) -> Headroom:
    """The headroom ``config`` asks for on this cluster (nothing read when it is off)."""
    if config.headroom is Cover.OFF:
        return Headroom(Cover.OFF)
    capacity_of = {n.name: config.node_capacity(n.labels) for n in nodes}
    return size(config.headroom, at_risk(nodes, states, capacity_of), config.headroom_max_pods)


# A placeholder still unscheduled after this long has had no node launched for it: a launch
# takes 30-40 s with Karpenter and a few minutes with the Cluster Autoscaler (its node group
# backoff after a refused launch is 5 minutes, --initial-node-group-backoff-duration). The
# known cause is a Cluster Autoscaler run with --expendable-pods-priority-cutoff above -10: it
# ignores pods whose priority is below the cutoff (kubernetes/autoscaler
# cluster-autoscaler/core/utils/expendable.go, IsExpendablePod), so the headroom never gets room.
UNPLACED_SECONDS = 600.0


def unplaced(pods: Iterable[PodView], namespace: str, now: float, after: float = UNPLACED_SECONDS) -> int:
    """How many of the headroom's placeholders (pods labelled :data:`LABEL` in ``namespace``) the
    scheduler has found no room for (``PodScheduled`` False, reason Unschedulable:
    :attr:`PodView.unschedulable_since`) since more than ``after`` seconds before ``now``."""
    count = 0
    for pod in pods:
        if pod.namespace != namespace or pod.labels.get(LABEL) != "true":
            continue
        if pod.node_name or pod.terminating:
            continue
        since = pod.unschedulable_since
        if since and now - since > after:
            count += 1
    return count


def _mib(value: int) -> int:
    return math.ceil(value / 2**20)
